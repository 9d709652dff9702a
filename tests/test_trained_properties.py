"""Property-based tests on the trained side (issue 18): for every drawn toy, size, seed, architecture, width
and short budget, a model trained on the CPU satisfies what the theory and the implementation promise
(tests/trained_properties.py states each property and its tolerance).

Each property also has a negative control: a deliberately broken variant of the library (monkeypatched for
the test only) under which the same property function reports a violation, so no property is a test that
cannot fail. Profiles: tests/conftest.py (``make test HYPOTHESIS_PROFILE=thorough`` for more examples).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
import trained_properties
from trained_properties import (
    Problem,
    Run,
    constraint_violations,
    ddp_exact,
    ddp_violations,
    declares_constraint,
    is_linear,
    lifted_floor_violations,
    make_problem,
    objective_chain_violations,
    polish_violations,
    problems,
    resume_violations,
    runs,
    save_load_violations,
    trained_settings,
)

from dictcheck.empirics.architectures import bilinear, bsf, linear_sae
from dictcheck.empirics.io import sae_folder
from dictcheck.empirics.metrics import reconstruction
from dictcheck.empirics.training import checkpoints, loop
from dictcheck.empirics.architectures import REGISTRY, architecture, build_model
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.training.loop import TrainConfig
from dictcheck.solvers import polish

# ------------------------------------------------------------------------------------------------- properties


# Every property is parametrised by architecture, so that the default (CI) profile trains every registered
# architecture the property applies to; hypothesis draws the rest (toy, size, seed, width, options, budget).


def _archs(applies: Callable[[str], bool]) -> list[str]:
    return [name for name in REGISTRY if applies(name)]


def _run_of(data: st.DataObject, arch: str, **kw: Any) -> Run:
    return data.draw(runs(archs=lambda name: name == arch, **kw), label="run")


def _holds_after_training(prop: Callable[[Featurizer, Problem], list[str]], run: Run) -> None:
    """Train ``run`` and assert the property ``prop`` of the trained model on its problem."""
    violations = prop(run.train().model, run.problem)
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("arch", _archs(is_linear))
@trained_settings(ci=2, thorough=30)
@given(data=st.data())
def test_huber_bound_exact_codes_encoder_chain_and_kkt(arch: str, data: st.DataObject) -> None:
    """H(b*) ≤ H(b_dec) ≤ O(exact codes) ≤ O(encoder codes), KKT-z of the exact codes, on train and held-out."""
    _holds_after_training(objective_chain_violations, _run_of(data, arch))


@pytest.mark.parametrize("arch", _archs(lambda name: is_linear(name) and name != "abs"))
@trained_settings(ci=2, thorough=12)
@given(data=st.data())
def test_polish_never_raises_the_objective_and_ends_stationary(arch: str, data: st.DataObject) -> None:
    """Polishing descends monotonically and ends stationary (``abs``' signed atoms are not objective (1)'s
    non-negative dictionary that polishing takes)."""
    _holds_after_training(polish_violations, _run_of(data, arch, problem=problems(n=(24, 96), d=(2, 4)), max_width=5))


@pytest.mark.parametrize("arch", _archs(declares_constraint))
@trained_settings(ci=2, thorough=20)
@given(data=st.data())
def test_decoder_constraints_hold_after_every_step(arch: str, data: st.DataObject) -> None:
    violations = constraint_violations(_run_of(data, arch))
    assert not violations, "\n".join(violations[:10])


@pytest.mark.parametrize("arch", _archs(lambda name: architecture(name).family == "bilinear"))
@trained_settings(ci=2, thorough=30)
@given(data=st.data())
def test_bilinear_lifted_nmse_at_least_the_lifted_pca_floor(arch: str, data: st.DataObject) -> None:
    _holds_after_training(lifted_floor_violations, _run_of(data, arch))


@pytest.mark.parametrize("arch", _archs(lambda name: True))
@trained_settings(ci=2, thorough=12)
@given(data=st.data())
def test_save_load_reproduces_encode_and_decode_exactly(arch: str, data: st.DataObject) -> None:
    run = _run_of(data, arch, steps=(1, 40))
    with tempfile.TemporaryDirectory() as tmp:
        violations = save_load_violations(run, Path(tmp))
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("arch", _archs(lambda name: True))
@trained_settings(ci=2, thorough=12)
@given(data=st.data())
def test_resume_after_a_stop_equals_the_uninterrupted_run(arch: str, data: st.DataObject) -> None:
    """The stop is drawn at or after the first checkpoint (before it, resuming is a fresh start) and before the
    last step (at it, there is nothing left to resume)."""
    run = _run_of(data, arch, steps=(2, 40), checkpoint_every=True)
    stop = data.draw(st.integers(run.config.checkpoint_every, run.config.steps - 1), label="stop after step")
    with tempfile.TemporaryDirectory() as tmp:
        violations = resume_violations(run, stop, Path(tmp))
    assert not violations, "\n".join(violations)


def _ddp_controls() -> list[Run]:
    """Negative controls carried by every DDP example: relu (declared exact) trained with both ranks reading the
    same half of the batch, and batchtopk (declared inexact: each rank keeps the top k·B/P of its own tokens)."""
    problem = make_problem("clusters", seed=0, n=60, d=4)
    return [_run(problem, "relu", 4, {"lam": 0.1}, steps=8), _run(problem, "batchtopk", 4, {"k": 1}, steps=8)]


@trained_settings(ci=2, thorough=10)
@given(data=st.data())
def test_two_gloo_ranks_equal_one_process_for_the_exact_architectures(data: st.DataObject) -> None:
    """One run drawn per architecture, kept where its drawn options are declared exact (:func:`ddp_exact`); all
    share one pair of spawned ranks (process start-up is most of the cost), with the two controls of
    :func:`_ddp_controls` after them, which must be reported: relu's broken shard by its weights, batchtopk by
    its ranks' gradient, which is not the whole batch's."""
    drawn = [_run_of(data, name, steps=(1, 25), dtypes=(torch.float64,)) for name in REGISTRY]
    jobs = [run for run in drawn if ddp_exact(run)]
    assert jobs, "no architecture drew options declared exact under DDP"
    controls = _ddp_controls()
    assert ddp_exact(controls[0]) and not ddp_exact(controls[1])
    with tempfile.TemporaryDirectory() as tmp:
        violations = ddp_violations(jobs + controls, Path(tmp), broken_shard=frozenset({len(jobs)}))
    prefixes = tuple(f"job {len(jobs) + i} ({c.arch}): two ranks' " for i, c in enumerate(controls))
    for prefix, report in zip(prefixes, ("differs from one process's", "gradient differs from the whole batch's")):
        assert any(v.startswith(prefix) and report in v for v in violations), f"control not reported: {prefix!r}"
    violations = [v for v in violations if not v.startswith(prefixes)]
    assert not violations, "\n".join(violations)


# ------------------------------------------------------------------------------------------------- the new hook


def test_every_architecture_declares_whether_its_decoder_is_constrained() -> None:
    """decoder_constraint_violation is None exactly where decoder_norm is "none", else ~0 on a fresh model and
    positive once the decoder is pushed off the constraint (the Grassmannian frames cannot be: see
    test_constraints_fail_when_grassmann_frames_skip_the_qr for its measure failing)."""
    for name, arch in REGISTRY.items():
        options = {"relu": {"lam": 0.1}, "abs": {"lam": 0.1}, "jumprelu": {"lam": 0.1}, "topk": {"k": 1},
                   "batchtopk": {"k": 1}, "vasae": {"k": 1}, "bsf-vanilla": {"k": 1, "block_size": 2},
                   "bsf-grassmann": {"k": 1, "block_size": 2}, "bsf-grouplasso": {"block_size": 2}}.get(name, {})
        model = build_model(name, 5, 4, options, dtype=torch.float64)
        v = arch.decoder_constraint_violation(model)
        if arch.decoder_norm == "none":
            assert v is None, name
            continue
        assert v is not None and v <= 1e-14, (name, v)
        with torch.no_grad():
            (model.B if name == "bsf-grassmann" else model.W_dec).mul_(1.01)
        if name == "bsf-grassmann":  # the frames are the QR of B: orthonormal for any B, by construction
            assert arch.decoder_constraint_violation(model) <= 1e-14
        else:
            assert arch.decoder_constraint_violation(model) > 1e-3, name


# ------------------------------------------------------------------------------------------------- negative controls
#
# One fixed example per property, drawn like the strategies draw them, passes as it is; with the named part of
# the library broken, the property reports a violation whose message names it.


def _run(problem: Problem, arch: str, d_sae: int, options: dict, *, steps: int = 60, batch_size: int = 16,
         dtype: torch.dtype = torch.float64, seed: int = 3, checkpoint_every: int = 0, lr: float | None = 1e-2) -> Run:
    return Run(problem, arch, d_sae, options, dtype,
               TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, device="cpu", log_every=10,
                           checkpoint_every=checkpoint_every))


def _wide_relu() -> Run:
    """A wide relu SAE on three rays: close to the wide-limit bound (docs/theory.md §4.4)."""
    problem = make_problem("rays", seed=1, n=60, d=2)
    return _run(problem, "relu", 6, {"lam": problem.lam}, steps=150, lr=2e-2)


def test_chain_fails_when_the_objective_drops_the_2_on_lambda(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _wide_relu()
    model = run.train().model
    assert objective_chain_violations(model, run.problem) == []

    def one_lambda(W, Z, b, X, lam):  # objective (1) with λ‖z‖₁ instead of 2λ‖z‖₁
        R = np.asarray(X) - np.asarray(b).reshape(-1, 1) - W @ Z
        return float((np.sum(R * R) + lam * np.sum(np.abs(Z))) / R.shape[1])

    monkeypatch.setattr(reconstruction, "sae_objective", one_lambda)
    violations = objective_chain_violations(model, run.problem)
    assert any("H(b_dec)" in v and "> O(exact codes)" in v for v in violations), violations


def test_kkt_fails_when_the_exact_codes_solve_the_wrong_lasso(monkeypatch: pytest.MonkeyPatch) -> None:
    """Codes of the lasso with penalty λ‖z‖₁ (the 2 dropped) are not objective (1)'s: KKT-z fails."""
    run = _wide_relu()
    model = run.train().model
    real = trained_properties.exact_codes
    monkeypatch.setattr(trained_properties, "exact_codes", lambda W, X, b, lam, **kw: real(W, X, b, lam / 2, **kw))
    violations = objective_chain_violations(model, run.problem)
    assert any("violate KKT-z" in v for v in violations), violations


def test_polish_fails_when_its_bias_step_goes_the_wrong_way(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = make_problem("independent_features", seed=2, n=60, d=3)
    run = _run(problem, "relu", 4, {"lam": problem.lam})
    model = run.train().model
    assert polish_violations(model, problem) == []

    class MeanSignFlipped(np.ndarray):
        """R.mean(axis=1) with the opposite sign: the bias moves away from the mean residual."""

        def mean(self, *args, **kwargs):
            return -np.asarray(self).mean(*args, **kwargs)

    real = polish.centred
    monkeypatch.setattr(polish, "centred", lambda X, b: real(X, b).view(MeanSignFlipped))
    # the broken descent never converges: 20 sweeps (not 2000) show the rise
    monkeypatch.setattr(trained_properties, "polish_dictionary", functools.partial(polish.polish_dictionary, max_iter=20))
    violations = polish_violations(model, problem)
    assert any("raised objective (1)" in v for v in violations), violations


def test_polish_fails_when_it_never_learns_the_bias(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the bias step polishing still descends but stops where ΣR ≠ 0: not stationary."""
    problem = make_problem("independent_features", seed=2, n=60, d=3)
    run = _run(problem, "relu", 4, {"lam": problem.lam})
    model = run.train().model
    monkeypatch.setattr(trained_properties, "polish_dictionary",
                        functools.partial(polish.polish_dictionary, learn_bias=False))
    violations = polish_violations(model, problem)
    assert any("fails" in v and "bias" in v for v in violations), violations


@pytest.mark.parametrize("arch, options, owner, hook", [
    ("relu", {"lam": 0.1}, linear_sae.LinearSAE, "normalise_decoder_"),
    ("bsf-vanilla", {"k": 1, "block_size": 2}, bsf.VanillaBSF, "project_parameters_"),
])
def test_constraints_fail_when_the_projection_is_skipped(monkeypatch: pytest.MonkeyPatch, arch: str, options: dict,
                                                         owner: type, hook: str) -> None:
    run = _run(make_problem("clusters", seed=0, n=60, d=4), arch, 4, options, steps=10)
    assert constraint_violations(run) == []
    monkeypatch.setattr(owner, hook, lambda self: None)
    violations = constraint_violations(run)
    assert any(v.startswith("after step 1:") and architecture(arch).decoder_norm in v for v in violations), violations


def test_constraints_fail_when_grassmann_frames_skip_the_qr(monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw B_g used as frames: orthonormal at init (B is built as a QR), not after a step."""
    run = _run(make_problem("clusters", seed=0, n=60, d=4), "bsf-grassmann", 4, {"k": 1, "block_size": 2}, steps=10)
    assert constraint_violations(run) == []
    real = bsf._sign_fixed_q
    model = run.build()
    monkeypatch.setattr(bsf, "_sign_fixed_q", lambda G: G)
    monkeypatch.setattr(Run, "build", lambda self: model)  # the properly initialised model, trained broken
    violations = constraint_violations(run)
    assert violations and violations[0].startswith("after step 1:") and "qr_orthonormal" in violations[0], violations
    assert real is not bsf._sign_fixed_q


def test_lifted_floor_fails_when_the_kernel_term_is_halved(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ⟨K, ZᵀZ⟩ halved the loss is no longer ‖T − T̂‖² and trains below the Eckart–Young floor."""
    problem = make_problem("quadric", seed=1, n=200, d=3)
    run = _run(problem, "bilinear-atomic", 2, {"hoyer_coef": 0.0}, steps=80)
    assert lifted_floor_violations(run.train().model, problem) == []
    real = bilinear.quadratic_term
    monkeypatch.setattr(bilinear, "quadratic_term", lambda *a, **kw: 0.5 * real(*a, **kw))
    violations = lifted_floor_violations(run.train().model, problem)
    assert any("(forward)" in v and "< lifted-PCA floor" in v for v in violations), violations


@pytest.mark.parametrize("arch, options", [("topk", {"k": 2}), ("bsf-grassmann", {"k": 1, "block_size": 2})])
def test_save_load_fails_when_a_saved_weight_is_perturbed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arch: str,
                                                          options: dict) -> None:
    run = _run(make_problem("clusters", seed=0, n=60, d=4), arch, 4, options, steps=20)
    assert save_load_violations(run, tmp_path / "ok") == []
    real = sae_folder.write_sae_files

    def perturbed(directory, weights, cfg, schema, **kw):  # one ulp on the first entry of the first tensor
        weights = dict(weights)
        name = sorted(weights)[0]
        w = weights[name].clone()
        w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(np.inf, dtype=w.dtype))
        weights[name] = w
        return real(directory, weights, cfg, schema, **kw)

    monkeypatch.setattr(sae_folder, "write_sae_files", perturbed)
    violations = save_load_violations(run, tmp_path / "broken")
    assert any("reloaded weight" in v for v in violations), violations


def test_resume_fails_when_the_batch_rng_state_is_not_restored(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    run = _run(make_problem("parent_child", seed=0, n=60, d=3), "relu", 4, {"lam": 0.1}, steps=20, checkpoint_every=5)
    assert resume_violations(run, 12, tmp_path / "ok") == []
    real = checkpoints.resume_checkpoint

    def fresh_batch_rng(ckpt_dir, world):  # the checkpoint's batch generator replaced by a newly seeded one
        found = real(ckpt_dir, world)
        if found is not None:
            found[1]["batch_rng"] = torch.Generator().manual_seed(12345).get_state()
        return found

    monkeypatch.setattr(loop, "resume_checkpoint", fresh_batch_rng)
    violations = resume_violations(run, 12, tmp_path / "broken")
    assert any("resumed after step 12 (from 10)" in v for v in violations), violations
