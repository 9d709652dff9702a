"""Property-based tests on the trained side (issue 18): strategies that draw a toy, its size, a seed, an
architecture from the registry, a width and a short training budget, and the invariants every trained model
must satisfy, each as a function that returns the list of its violations (empty when it holds).

Used by ``tests/test_trained_properties.py``, which runs each property under hypothesis and, as a negative
control, against a deliberately broken variant of the library (the property must then report a violation).

Layout: data are (N, D) rows, as the training loop takes them; the theory functions get the transposes
(points as columns, docs/README.md). Objective (1) of docs/theory.md §1 is
O(W, Z, b) = (1/N) Σ_i [‖x_i − b − W z_i‖² + 2λ‖z_i‖₁] with unit atoms (the 2λ and the 1/N exactly).

Every property runs with one torch thread (:func:`dictcheck.empirics.training.loop.torch_threads`): the models
are tiny, and the exact-code solver's thread pool costs 20–40× more than the work on 2 shared cores.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from dictcheck.empirics.architectures import REGISTRY, architecture, build_model
from dictcheck.empirics.architectures.base import OptionsContext
from dictcheck.empirics.training.distributed import World, process_group
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.data.manifold_toy import ManifoldConfig, make_manifold_benchmark
from dictcheck.empirics.metrics.reconstruction import unit_atom_objective
from dictcheck.empirics.data.quadric_toy import SHAPE_DIM, make_quadric_toy
from dictcheck.empirics.io.sae_folder import load_featurizer
from dictcheck.empirics.io.formats import load_any_sae
from dictcheck.empirics.io.saelens import CFG_FILE
from dictcheck.empirics.data.toys import make_toy
from dictcheck.empirics.training.loop import LOG_FILE, TrainConfig, TrainResult, torch_threads, train
from dictcheck.proofs_checks.checks.bilinear import lifted_pca_floor
from dictcheck.proofs_checks.checks.sae import GAP_TOL
from dictcheck.solvers.lasso_codes import exact_codes, kkt_violation
from dictcheck.solvers.medians import huber_median
from dictcheck.solvers.polish import polish_dictionary
from dictcheck.solvers.stream_diagnostics import batch_size_for, column_batches, stream_diagnostics
from dictcheck.theory.bilinear_lifted import kernel_lifted_loss
from dictcheck.theory.huber import huber_objective
from dictcheck.theory.objective import to_unit_atoms

# ------------------------------------------------------------------------------------------------- settings

#: The environment variable of tests/conftest.py: ``thorough`` selects more examples here too.
PROFILE_ENV = "DICTCHECK_HYPOTHESIS_PROFILE"


def trained_settings(ci: int, thorough: int) -> settings:
    """Hypothesis settings of a trained-side property: ``ci`` examples by default (CI), ``thorough`` under the
    thorough profile. No deadline (a training run takes ~0.1–1 s), the example database kept (a shrunk failure
    is replayed first on the next run), and the reproduction blob printed with a failure."""
    n = thorough if os.environ.get(PROFILE_ENV, "") == "thorough" else ci
    return settings(max_examples=n, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# ------------------------------------------------------------------------------------------------- problems

#: The toys drawn: those of :func:`make_toy` whose size can be chosen (the fixed presets ``rays_reference`` and
#: ``crowded_median`` have 9 and 6 points), the manifold benchmark (docs/bsf.md §5) and the quadric toy
#: (docs/bilinear.md §6).
TOY_NAMES = ("independent_features", "parent_child", "dense_scalar", "dense_feature", "rank_one", "rays",
             "clusters", "manifold", "quadric")
#: λ of objective (1) for the two toys that do not define one (unit-scale manifolds, unit tokens).
FREE_TOY_LAM = 0.1
#: Share of a generated toy kept out of training (the manifold benchmark has its own evaluation split).
HELD_OUT_FRACTION = 0.25


@dataclass(frozen=True, eq=False)
class Problem:
    """A toy's training rows ``X`` (N, D) and held-out rows ``X_held`` (M, D), float64, and its λ."""

    name: str
    params: dict[str, Any]
    X: NDArray[np.float64]
    X_held: NDArray[np.float64]
    lam: float

    @property
    def D(self) -> int:
        return int(self.X.shape[1])

    @property
    def has_zero_rows(self) -> bool:
        """Whether a row is exactly 0 (a bilinear batch of zero rows has no token: ValueError by design)."""
        return bool(np.any(~np.any(self.X, axis=1)))

    def __repr__(self) -> str:
        return f"Problem({self.name!r}, {self.params}, N={self.X.shape[0]}, D={self.D}, lam={self.lam:g})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """What hypothesis prints for a failing example: the repr (the toy is rebuilt from name and params)."""
        printer.text(repr(self))


def _split(X_cols: NDArray, seed: int) -> tuple[NDArray, NDArray]:
    """(training rows, held-out rows) of the points (columns) of X, by a seeded permutation."""
    rows = np.ascontiguousarray(np.asarray(X_cols, dtype=np.float64).T)
    perm = np.random.default_rng(seed).permutation(rows.shape[0])
    n_held = max(1, int(round(HELD_OUT_FRACTION * rows.shape[0])))
    return np.ascontiguousarray(rows[perm[n_held:]]), np.ascontiguousarray(rows[perm[:n_held]])


def make_problem(name: str, seed: int, n: int, d: int) -> Problem:
    """Toy ``name`` with about ``n`` points in (about) ``d`` dimensions at ``seed``, split into training and
    held-out rows. ``d`` is used where the generator lets the dimension vary (``d`` ≥ 2)."""
    params: dict[str, Any] = {"seed": seed, "n": n, "d": d}
    if name == "manifold":
        n_circles = max(1, d // 2)
        cfg = ManifoldConfig(D=2 * n_circles + 1, counts=(("circle", n_circles),), k_true=1 + seed % n_circles,
                             n_train=n, n_eval=max(1, n // 3))
        bench = make_manifold_benchmark(cfg, seed=seed)
        return Problem(name, params, np.ascontiguousarray(bench.train.X), np.ascontiguousarray(bench.eval.X),
                       FREE_TOY_LAM)
    if name == "quadric":
        shapes = ("circle", "ellipsoid", "hyperboloid")[: 1 + seed % 3]
        D = sum(SHAPE_DIM[s] for s in shapes) + max(1, d - 2)
        toy = make_quadric_toy(seed=seed, N=n, D=D, shapes=shapes)
        return Problem(name, params, *_split(toy.X, seed), FREE_TOY_LAM)
    kw: dict[str, Any] = {
        "independent_features": {"N": n, "D": d, "k": d},
        "parent_child": {"n_parent_only": max(1, n // 2), "n_child1": max(1, n // 4), "n_child2": max(1, n // 4)},
        "dense_scalar": {"N": n, "D": d},
        "dense_feature": {"N": n},
        "rank_one": {"N": n, "D": d},
        "rays": {"radii": None, "n_per_ray": max(1, n // 3), "near_points": None},
        "clusters": {"n_per_cluster": max(1, n // 3), "D": d},
    }[name]
    toy = make_toy(name, seed=seed, **kw)
    return Problem(name, params, *_split(toy.X, seed), float(toy.lam))


@st.composite
def problems(draw: st.DrawFn, names: tuple[str, ...] = TOY_NAMES, n: tuple[int, int] = (24, 160),
             d: tuple[int, int] = (2, 6), nonzero_rows: bool = False) -> Problem:
    """A toy from ``names`` at a drawn seed, size and dimension (``nonzero_rows``: no row exactly 0)."""
    name = draw(st.sampled_from(names))
    problem = make_problem(name, draw(st.integers(0, 2**16)), draw(st.integers(*n)), draw(st.integers(*d)))
    assume(not (nonzero_rows and problem.has_zero_rows))
    return problem


# ------------------------------------------------------------------------------------------------- runs

#: Families with a linear decoder W_dec and an ``encode`` (objective (1) applies to their decoder).
LINEAR_FAMILIES = ("sae", "vasae")
_EMBEDDINGS: list[Path] = []


def _embedding_file(D: int) -> str:
    """A fixed random token embedding W_E (32, D) as a .npy file (VASAE's anchor_source), in a temporary
    folder removed when the process exits."""
    if not _EMBEDDINGS:
        _EMBEDDINGS.append(Path(tempfile.mkdtemp(prefix="dictcheck-props-")))
        atexit.register(shutil.rmtree, _EMBEDDINGS[0], True)
    path = _EMBEDDINGS[0] / f"embedding_{D}.npy"
    if not path.exists():
        np.save(path, np.random.default_rng(D).normal(size=(32, D)).astype(np.float32))
    return str(path)


@dataclass(frozen=True)
class Run:
    """One training run: the problem, the architecture with its width and options, the model's dtype and
    init seed, and the loop's config (``out`` is given per call)."""

    problem: Problem
    arch: str
    d_sae: int
    options: Mapping[str, Any]
    dtype: torch.dtype
    config: TrainConfig

    @property
    def rows(self) -> NDArray:
        """The training rows in the model's dtype (what a user passes)."""
        return self.problem.X.astype(_NUMPY_DTYPES[self.dtype])

    @property
    def held_rows(self) -> NDArray:
        return self.problem.X_held.astype(_NUMPY_DTYPES[self.dtype])

    def build(self) -> Featurizer:
        """A fresh model (init seed = the config's seed, as ``dictcheck train`` does)."""
        return build_model(self.arch, self.problem.D, self.d_sae, dict(self.options), seed=self.config.seed,
                           dtype=self.dtype)

    def train(self, out: str | os.PathLike[str] | None = None, **kw: Any) -> TrainResult:
        """Train a fresh model (or ``model=`` given) on the training rows with one torch thread."""
        model = kw.pop("model", None) or self.build()
        with torch_threads(1):
            return train(model, self.rows, self.config, out, progress=False, **kw)


_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _options(draw: st.DrawFn, arch: str, d_sae: int, q: int, problem: Problem) -> dict[str, Any]:
    """Options of ``arch`` at width ``d_sae`` (block size ``q`` for the BSFs): the architecture's own strategy
    (:meth:`Architecture.draw_options`)."""
    k = draw(st.integers(1, min(d_sae, 4)))
    ctx = OptionsContext(d_in=problem.D, d_sae=d_sae, block_size=q, k=k, lam=problem.lam,
                         embedding=lambda: _embedding_file(problem.D))
    return architecture(arch).draw_options(draw, st, ctx)


@st.composite
def runs(draw: st.DrawFn, problem: st.SearchStrategy[Problem] | None = None,
         archs: Callable[[str], bool] = lambda name: True, max_width: int = 8, steps: tuple[int, int] = (1, 120),
         dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64), batch_sizes: tuple[int, ...] = (8, 16, 32),
         checkpoint_every: bool = False) -> Run:
    """A run: a problem, an architecture of the registry accepted by ``archs``, a width, options, a dtype, a seed,
    a learning rate (the architecture's default or drawn), a centring rule the architecture allows and a
    short budget of ``steps`` (with ``checkpoint_every``, also a checkpoint interval, before the last step when
    there are two or more)."""
    names = [name for name in REGISTRY if archs(name)]
    arch = draw(st.sampled_from(names))
    prob = draw(problem if problem is not None else
                problems(nonzero_rows=arch.startswith("bilinear-")))
    q = 1
    if architecture(arch).family == "bsf":
        q = draw(st.integers(1, min(3, prob.D)))
        d_sae = q * draw(st.integers(1, max(1, max_width // q)))
    else:
        d_sae = draw(st.integers(1, max_width))
    options = _options(draw, arch, d_sae, q, prob)
    a = architecture(arch)
    b_dec_init = draw(st.sampled_from(list(a.b_dec_inits)))
    n_steps = draw(st.integers(*steps))
    lr = draw(st.one_of(st.none(), st.floats(1e-4, 3e-2)))
    config = TrainConfig(steps=n_steps, batch_size=draw(st.sampled_from(batch_sizes)), lr=lr,
                         seed=draw(st.integers(0, 2**16)), device="cpu", b_dec_init=b_dec_init,
                         log_every=draw(st.integers(1, 40)), keep_checkpoints=2,
                         checkpoint_every=draw(st.integers(1, max(1, n_steps - 1))) if checkpoint_every else 0)
    return Run(prob, arch, d_sae, options, draw(st.sampled_from(dtypes)), config)


def is_linear(name: str) -> bool:
    """A linear featurizer (decoder W_dec, codes from ``encode``): the linear SAEs and VASAE."""
    return architecture(name).family in LINEAR_FAMILIES


def declares_constraint(name: str) -> bool:
    return architecture(name).decoder_norm != "none"


# ------------------------------------------------------------------------------------------------- objective (1)

@dataclass(frozen=True)
class LinearDictionary:
    """A linear featurizer read as a dictionary of objective (1): unit atoms Ŵ (D, d_z), bias b = b_dec, and
    a function giving its encoder's codes of points (columns) in Ŵ's scale, non-negative. Signed codes
    (``abs``) are the non-negative codes (z₊, z₋) of the doubled dictionary [Ŵ, −Ŵ], which has the same
    objective (docs/theory.md §4.5)."""

    W: NDArray[np.float64]
    b: NDArray[np.float64]
    encode: Callable[[NDArray], NDArray[np.float64]]

    @classmethod
    def of(cls, model: Featurizer) -> LinearDictionary:
        W_raw = model.W_dec.detach().to(torch.float64).numpy().T
        W, _ = to_unit_atoms(W_raw, np.zeros((W_raw.shape[1], 0)))
        norms = np.linalg.norm(W_raw, axis=0)
        signed = architecture(model.arch).signed_codes

        def encode(X: NDArray) -> NDArray[np.float64]:
            with torch.no_grad():
                z = model.encode(torch.from_numpy(np.ascontiguousarray(X.T)).to(model.W_dec.dtype))
            Z = z.to(torch.float64).numpy().T * norms[:, None]
            return np.vstack([np.maximum(Z, 0), np.maximum(-Z, 0)]) if signed else Z

        return cls(np.hstack([W, -W]) if signed else W, model.b_dec.detach().to(torch.float64).numpy(), encode)


#: KKT tolerance of the exact codes: the solver's default contract (relative to λ, docs/theory.md §1).
KKT_TOL = 1e-8


@torch_threads(1)
def objective_chain_violations(model: Featurizer, problem: Problem) -> list[str]:
    """On the training rows and on the held-out rows, with λ the problem's:

    H(b*) ≤ H(b_dec) ≤ O(Ŵ, Z_exact, b_dec) ≤ O(Ŵ, Z_encoder, b_dec), and KKT-z of Z_exact ≤ 1e-8,

    where H(b) = (1/N) Σ h_λ(‖x_i − b‖) is the wide-limit bound at bias b (docs/theory.md (6)–(7)): every unit-atom
    dictionary and every Z ≥ 0 have O ≥ H(b) because 2λ‖z‖₁ ≥ 2λ‖Ŵz‖; b* is the Huber median (§4.3). Z_exact are
    the exact codes of Ŵ at b_dec (:func:`exact_codes`), which minimise O over Z ≥ 0, so no encoder does better
    (the amortisation gap ≥ 0, §6). The KKT measure is :func:`dictcheck.solvers.lasso_codes.kkt_violation`,
    recomputed from the codes (not the solver's own report). Comparisons allow ``GAP_TOL`` = 1e-9 (the project's
    bar for the amortisation gap: exact codes reach KKT 1e-8 relative, so only rounding-level excess remains)."""
    d = LinearDictionary.of(model)
    out: list[str] = []
    for split, rows in (("train", problem.X), ("held-out", problem.X_held)):
        X = rows.T
        lam = problem.lam
        Zx = exact_codes(d.W, X, d.b, lam, tol=KKT_TOL).Z
        kkt = kkt_violation(d.W, Zx, X, d.b, lam)
        o_exact = unit_atom_objective(d.W, Zx, d.b, X, lam)
        o_enc = unit_atom_objective(d.W, d.encode(X), d.b, X, lam)
        h_b = huber_objective(d.b, X, lam)
        h_star = huber_median(X, lam).objective
        chain = [("H(b*)", h_star), ("H(b_dec)", h_b), ("O(exact codes)", o_exact), ("O(encoder codes)", o_enc)]
        for (na, a), (nb, b) in zip(chain, chain[1:]):
            if a > b - GAP_TOL:
                out.append(f"{split}: {na} = {a!r} > {nb} = {b!r}")
        if kkt > KKT_TOL:
            out.append(f"{split}: exact codes violate KKT-z by {kkt:.3g} > {KKT_TOL:g}")
    return out


# ------------------------------------------------------------------------------------------------- polish

@torch_threads(1)
def polish_violations(model: Featurizer, problem: Problem) -> list[str]:
    """Polishing the decoder and b_dec on the training rows (:func:`dictcheck.solvers.polish.polish_dictionary`,
    block coordinate descent on objective (1)) never raises the objective: every sweep's value is at most the
    previous one (the first at most ``objective_before``), up to the rounding of a sum of N terms in float64
    (N·ε relative, Higham's γ_N); and it ends at a point that passes the stationary conditions, the
    ``stationary`` verdict of :func:`stream_diagnostics` with a learned bias (KKT-z, S1, (5), (4) and ΣR = 0 to
    1e-6; docs/theory.md §3, §6), exactly what ``check-sae --polish`` reports as ``stationary``."""
    d = LinearDictionary.of(model)
    X = problem.X.T
    fit = polish_dictionary(d.W, d.b, X, problem.lam)
    values = (fit.objective_before, *fit.history)
    out = []
    slack = X.shape[1] * np.finfo(np.float64).eps
    for i, (prev, now) in enumerate(zip(values, values[1:])):
        if now > prev * (1 + slack):
            out.append(f"sweep {i + 1} raised objective (1) from {prev!r} to {now!r}")
    after = stream_diagnostics(fit.W, fit.codes, fit.b, column_batches(X, batch_size_for(X.shape[1])),
                               problem.lam, learned_bias=True).diagnostics
    if not after.stationary:
        out.append(f"polished point (after {fit.iterations} sweeps, converged={fit.converged}) fails "
                   f"{list(after.failed_checks)}: kkt {after.kkt_violation:.3g}, S1 {after.stationarity_violation:.3g}, "
                   f"hull {after.hull_violation:.3g}, bias {after.bias_identity_violation:.3g}, "
                   f"ΣR/(Nλ) {after.bias_residual_mean_norm / problem.lam:.3g}")
    return out


# ------------------------------------------------------------------------------------------------- constraints

def constraint_tolerance(model: Featurizer) -> float:
    """Rounding allowance of the decoder constraint after the loop's projection, in the model's dtype (eps):
    a norm over m entries and a division leave |‖w‖ − 1| ≤ (m + 2)·eps (Higham's γ bound), m = D for unit rows,
    D·q for unit-Frobenius blocks; a Householder QR of a D × q block leaves ‖QᵀQ − I‖_F ≤ D·q·eps·c with a
    small constant, taken as 4. Measured: ≤ 1.5 eps (rows, blocks) and ≤ 7 eps (frames) at D ≤ 64."""
    eps = torch.finfo(next(model.parameters()).dtype).eps
    D = int(model.d_in)
    q = int(getattr(model, "q", 1))
    policy = architecture(model.arch).decoder_norm
    return (4 * D * q if policy == "qr_orthonormal" else D * q + 2) * eps


@torch_threads(1)
def constraint_violations(run: Run) -> list[str]:
    """Train ``run`` and measure the declared decoder constraint (:meth:`Architecture.decoder_constraint_violation`:
    unit rows, unit-Frobenius blocks, orthonormal Grassmannian frames) on the fresh model and after every step
    (the loop's ``on_step``); each must be within :func:`constraint_tolerance`."""
    arch = architecture(run.arch)
    model = run.build()
    tol = constraint_tolerance(model)
    out: list[str] = []

    def measure(step: int) -> None:
        v = arch.decoder_constraint_violation(model)
        if v is None or not v <= tol:
            out.append(f"after step {step}: {arch.decoder_norm} violated by {v!r} > {tol:.3g}")

    measure(0)
    run.train(model=model, on_step=measure)
    return out


# ------------------------------------------------------------------------------------------------- bilinear

def lift_rank_bound(model: Featurizer) -> int:
    """The rank of the linear map T ↦ T̂ a bilinear model applies to the lifts T = xxᵀ: at most d_sae (one
    form per latent), and at most n_atoms for the compound prior (its forms lie in the span of the atom lifts
    u_j u_jᵀ; docs/bilinear.md §2)."""
    n_atoms = getattr(model.arch_options, "n_atoms", None)
    return int(model.d_sae if n_atoms is None else min(model.d_sae, n_atoms))


@torch_threads(1)
def lifted_floor_violations(model: Featurizer, problem: Problem) -> list[str]:
    """On training and held-out rows: the lifted NMSE (1/N) Σ ‖T_i − T̂_i‖²_F of the unit tokens is at least the
    lifted-PCA floor at the model's rank bound r, 1 − (top-r squared singular values of the lifts)/N
    (Eckart–Young: T̂ = T·M with rank M ≤ r; docs/bilinear.md §1, §8). Measured twice: the kernel-trick loss of
    the weights in float64 (``theory.bilinear_lifted.kernel_lifted_loss``) and the model's own forward pass
    (``nmse_lifted``, on a float64 copy of the model, eval mode). Allowance 1e-9 (float64 rounding of sums of
    O(N) unit-scale terms, ~1e-14, far below)."""
    r = lift_rank_bound(model)
    twin = build_model(model.arch, model.d_in, model.d_sae, model.arch_options, dtype=torch.float64)
    twin.load_state_weights({k: v.to(torch.float64) for k, v in model.state_weights().items()})
    twin.eval()
    out = []
    for split, rows in (("train", problem.X), ("held-out", problem.X_held)):
        unit = rows[np.any(rows, axis=1)]
        unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
        floor = lifted_pca_floor(unit, r)
        with torch.no_grad():
            forward = float(twin(torch.from_numpy(np.ascontiguousarray(rows))).extra["nmse_lifted"])
        for how, value in (("kernel loss", kernel_lifted_loss(unit, model.dictionary())), ("forward", forward)):
            if value < floor - 1e-9:
                out.append(f"{split}: lifted NMSE ({how}) {value!r} < lifted-PCA floor {floor!r} at rank {r}")
    return out


# ------------------------------------------------------------------------------------------------- save / load

def _outputs(model: Featurizer, rows: NDArray) -> dict[str, torch.Tensor]:
    """What a featurizer computes for tokens: its codes and, where it has one, x̂ (eval mode)."""
    model.eval()
    with torch.no_grad():
        res = model(torch.from_numpy(np.ascontiguousarray(rows)).to(next(model.parameters()).dtype))
    outs = {"codes": res.codes}
    if res.x_hat is not None:
        outs["x_hat"] = res.x_hat
    return outs


def _summation_bound(model: Featurizer, codes: torch.Tensor) -> torch.Tensor:
    """Elementwise bound on the difference of two evaluations of x̂ = z W_dec + b_dec that differ only in the
    order of the d_sae + 1 terms (a dense product against the sparse embedding-bag decode): each computed sum is
    within γ_n Σ|terms| of the exact one, n = d_sae + 1, γ_n ≈ n·u = n·eps/2 (Higham §3.1), so the two differ
    by at most n·eps·(|z| |W_dec| + |b_dec|)."""
    W, b = model.W_dec.detach(), model.b_dec.detach()
    eps = torch.finfo(W.dtype).eps
    return (model.d_sae + 1) * eps * (codes.abs() @ W.abs() + b.abs())


def _compare(tag: str, a: Featurizer, b: Featurizer, problem: Problem, *, same_code: bool = True) -> list[str]:
    """Compare the outputs of two models on the training and held-out rows: bit for bit, except, when ``b`` is
    another architecture's code reading the same folder (``same_code`` False), x̂ up to the order of its sum
    (:func:`_summation_bound`); the codes are always compared bit for bit."""
    out = []
    dtype = {torch.float32: np.float32, torch.float64: np.float64}[next(a.parameters()).dtype]
    for split, rows in (("train", problem.X), ("held-out", problem.X_held)):
        oa, ob = _outputs(a, rows.astype(dtype)), _outputs(b, rows.astype(dtype))
        for name in oa:
            if name not in ob or oa[name].shape != ob[name].shape:
                out.append(f"{tag}, {split}: {name} missing or misshapen")
                continue
            diff = (oa[name] - ob[name]).abs()
            if name == "x_hat" and not same_code:
                bad = bool((diff > _summation_bound(a, oa["codes"])).any())
            else:
                bad = not torch.equal(oa[name], ob[name])
            if bad:
                out.append(f"{tag}, {split}: {name} differs (max |Δ| {float(diff.max()):.3g})")
    return out


def saelens_reader(arch: str) -> str | None:
    """The architecture that reads ``arch``'s folder as a plain SAELens folder (cfg.json without
    ``metadata.dictcheck``): a registered architecture that reads foreign folders saved under the same SAELens
    name, or None where the format does not allow it (dictcheck-only architectures)."""
    saved = architecture(arch).saved_name
    readers = [a.name for a in REGISTRY.values() if a.reads_foreign and a.saved_name == saved]
    return readers[0] if readers else None


@torch_threads(1)
def save_load_violations(run: Run, folder: Path) -> list[str]:
    """Train ``run`` into ``folder`` (the SAELens layout :func:`train` writes) and reload it with
    :func:`load_featurizer`: the weights and the codes and reconstruction on training and held-out rows must be
    bit-identical. Where the format allows (:func:`saelens_reader`), the same folder with ``metadata.dictcheck``
    removed, as SAELens writes it, is read by :func:`load_any_sae` as that architecture and must compute the same
(where that is another architecture's code, x̂ up to the order of its sum, :func:`_summation_bound`)."""
    result = run.train(folder / "sae")
    trained = result.model
    loaded, _ = load_featurizer(folder / "sae")
    out = []
    saved = loaded.state_weights()
    for name, w in result.weights.items():
        if name not in saved or saved[name].dtype != w.dtype or not torch.equal(saved[name], w):
            out.append(f"reloaded weight {name} differs from the trained one")
    out += _compare("load_featurizer", trained, loaded, run.problem)
    reader = saelens_reader(run.arch)
    if reader is not None:
        plain = folder / "saelens"
        shutil.copytree(folder / "sae", plain, ignore=shutil.ignore_patterns("checkpoints", LOG_FILE))
        cfg = json.loads((plain / CFG_FILE).read_text())
        cfg["metadata"].pop("dictcheck", None)
        (plain / CFG_FILE).write_text(json.dumps(cfg))
        foreign, _, fmt = load_any_sae(plain)
        if foreign.arch != reader or fmt != "saelens":
            out.append(f"SAELens folder read as {foreign.arch!r} ({fmt}), expected {reader!r}")
        out += _compare(f"SAELens layout read as {foreign.arch}", trained, foreign, run.problem,
                        same_code=foreign.arch == run.arch)
    return out


# ------------------------------------------------------------------------------------------------- resume

class StopTraining(Exception):
    """Raised from ``on_step`` to stop a run after a given step (a kill without the process)."""


@torch_threads(1)
def resume_violations(run: Run, stop: int, folder: Path) -> list[str]:
    """Train ``run`` uninterrupted into ``folder/full``; train it again into ``folder/part`` but stop after step
    ``stop`` (after that step's checkpoint, if any), then resume a freshly built model from the newest checkpoint
    (:func:`train` with ``resume=True``): weights, buffers, the final loss and the log (but the timings) must equal
    the uninterrupted run's bit for bit (docs: training.py, "Checkpoints")."""
    full = run.train(folder / "full")

    def halt(step: int) -> None:
        if step == stop:
            raise StopTraining

    try:
        run.train(folder / "part", on_step=halt)
    except StopTraining:
        pass
    resumed = run.train(folder / "part", resume=True)
    out = []
    state = resumed.model.state_dict()
    for name, w in full.model.state_dict().items():
        v = state.get(name)
        if v is None or v.dtype != w.dtype or not torch.equal(v, w):
            out.append(f"resumed after step {stop} (from {resumed.resumed_from}): {name} differs")
    if resumed.final_loss != full.final_loss and not (math.isnan(full.final_loss) and math.isnan(resumed.final_loss)):
        out.append(f"final loss {resumed.final_loss!r} != {full.final_loss!r}")
    logs = [[{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
             for line in (folder / part / LOG_FILE).read_text().splitlines()] for part in ("full", "part")]
    if logs[0] != logs[1]:
        out.append("the resumed run's train_log.jsonl differs from the uninterrupted run's")
    return out


# ------------------------------------------------------------------------------------------------- DDP

#: Two ranks against one process that computes each step's gradient as they do (:class:`_RanksInOneProcess`):
#: the same floating-point operations in the same order, so the weights must agree bit for bit (measured: all
#: 1797 drawn float64 jobs, 651 of any exact architecture on any toy and 1146 on the degenerate dense_scalar and
#: rank_one toys). A bug in the sharding or the all-reduce moves them by O(lr) = 1e-4 or more. Against a plain
#: one-process run no tolerance holds: the gradients differ by the order of floating-point sums, ~1e-16
#: relative, but Adam divides every gradient component by √v̂ + eps, so a component whose exact gradient
#: vanishes (dense_scalar's two points either side of b_dec make ∇b_dec exactly 0) turns that rounding into
#: steps of up to lr·noise/eps ≈ 1e6·noise and the runs drift apart (abs on dense_scalar: W_enc 5.9e-7 apart
#: after 11 steps; one process on the same batches reversed: 9.5e-6 from the unreversed run).
DDP_ATOL = 0.0

#: The Equivalence identity itself, (1/P)Σ_r ∇(1/b)Σ_{t∈r} ℓ_t = ∇(1/B)Σ_t ℓ_t, is checked at every step at the
#: same weights, where Adam cannot amplify anything: the two sides differ by the order of sums only (measured
#: at most 9.8e-16 of the scale :class:`_SplitBatch` states, over the 1797 jobs above); 1e-12 leaves three
#: orders of margin, while a loss that couples the tokens of a batch (batchtopk, the control) misses it by O(1).
DDP_GRADIENT_RTOL = 1e-12

#: The number of gloo ranks the DDP property spawns, and the number of parts its one-process reference splits
#: each batch into.
DDP_RANKS = 2


def ddp_exact(run: Run) -> bool:
    """Whether ``run``'s architecture declares two ranks exact (:meth:`Architecture.ddp_inexactness` is None)."""
    a = architecture(run.arch)
    return a.ddp_inexactness(a.options(dict(run.options), run.d_sae)) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _SplitBatch(torch.nn.Module):
    """:class:`_RanksInOneProcess`' module: ``forward`` returns the whole batch's output whose ``loss``
    back-propagates the ranks' gradient (1/P)Σ_r g_r, each g_r the gradient of the model's loss on the r-th
    contiguous part of the batch, summed in rank order after the division by P as DDP's all-reduce does;
    ``fired`` reads the parts' latents (the OR of the ranks'). Each call appends to ``gaps`` the largest
    |(1/P)Σ_r g_r − g| over all entries, g the whole batch's gradient, over the larger of the largest |entry| of
    any of them and the batch's mean ‖x_t‖², the scale of a token's loss: where the exact gradient vanishes (a
    block spanning the data's space reconstructs it exactly), both sides are rounding noise of that scale's
    rounding (measured: entries ~1e-32, differing by 100 %, on dense_scalar with a bsf-grassmann block of q = D)."""

    def __init__(self, model: Featurizer, ranks: int, gaps: list[float]) -> None:
        super().__init__()
        self.model, self.ranks, self.gaps = model, ranks, gaps

    def forward(self, x: torch.Tensor, dead_mask: torch.Tensor | None = None) -> Any:
        params = [p for p in self.model.parameters() if p.requires_grad]
        parts, grads = [], []
        for part in x.tensor_split(self.ranks):
            parts.append(self.model(part, dead_mask=dead_mask))
            grads.append(torch.autograd.grad(parts[-1].loss, params))
        mean = [grads[0][i] / self.ranks for i in range(len(params))]
        for g in grads[1:]:
            mean = [m + gi / self.ranks for m, gi in zip(mean, g)]
        whole = self.model(x, dead_mask=dead_mask)
        full = torch.autograd.grad(whole.loss, params)
        scale = max(float(x.pow(2).sum(dim=-1).mean()), *(float(g.abs().max()) for gs in (*grads, full) for g in gs))
        gap = max(float((m - g).abs().max()) for m, g in zip(mean, full))
        self.gaps.append(gap / scale if scale > 0 else gap)
        surrogate = sum((p * m).sum() for p, m in zip(params, mean))
        live = torch.cat([out.fired(self.model.d_sae).nonzero().flatten() for out in parts])
        return dataclasses.replace(whole, loss=whole.loss.detach() + (surrogate - surrogate.detach()),
                                   live_latents=live)


@dataclass(frozen=True)
class _RanksInOneProcess(World):
    """Reference only: one process (size 1) whose every step's gradient is computed as :data:`DDP_RANKS` ranks
    compute it (:class:`_SplitBatch`, which also records the gap to the whole batch's gradient in ``gaps``)."""

    gaps: list[float] = field(default_factory=list)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return _SplitBatch(model, DDP_RANKS, self.gaps)


@dataclass(frozen=True)
class _SameShardWorld(World):
    """Negative control only: a world whose every rank reads rank 0's part of the global batch."""

    def shard(self, idx: torch.Tensor) -> torch.Tensor:
        return idx[: idx.shape[0] // self.size]


def _ddp_worker(rank: int, port: int, jobs: list[Run], folder: str, broken_shard: frozenset[int]) -> None:
    """One of two gloo ranks: join the group as torchrun would describe it (:func:`process_group`, which also
    collects the DDP wrappers before leaving it), train every job with it as the world (jobs in ``broken_shard``
    with :class:`_SameShardWorld`); rank 0 saves the weights."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(DDP_RANKS))
    torch.set_num_threads(1)
    with process_group(cuda=False) as world:
        for i, job in enumerate(jobs):
            job_world = (_SameShardWorld(rank=world.rank, size=world.size, local_rank=world.local_rank,
                                         device=world.device) if i in broken_shard else world)
            weights = train(job.build(), job.rows, job.config, progress=False, world=job_world).weights
            if rank == 0:
                torch.save(weights, Path(folder) / f"job_{i}.pt")


@torch_threads(1)
def ddp_violations(jobs: list[Run], folder: Path, *, broken_shard: frozenset[int] = frozenset()) -> list[str]:
    """Train every job with two gloo ranks (spawned processes, one torch thread each, global batch
    ``batch_size``) and in this process computing the ranks' gradient (:class:`_RanksInOneProcess`): the weights
    must agree to :data:`DDP_ATOL`, and that gradient must equal the whole batch's at every step to
    :data:`DDP_GRADIENT_RTOL` (docs of ``empirics.training.distributed``, "Equivalence"; only for architectures declared
    exact, :func:`ddp_exact`).
    ``broken_shard``: indices of jobs whose ranks all read rank 0's half of the batch (negative control only)."""
    out = []
    for i, job, differences, gap in ddp_differences(jobs, folder, broken_shard=broken_shard):
        for name, err in differences.items():
            if not err <= DDP_ATOL:
                out.append(f"job {i} ({job.arch}): two ranks' {name} differs from one process's by {err:.3g}")
        if not gap <= DDP_GRADIENT_RTOL:
            out.append(f"job {i} ({job.arch}): two ranks' gradient differs from the whole batch's by {gap:.3g} of "
                       "its scale (the largest entry or the batch's mean ‖x_t‖²)")
    return out


def ddp_differences(jobs: list[Run], folder: Path, *, broken_shard: frozenset[int] = frozenset()
                    ) -> list[tuple[int, Run, dict[str, float], float]]:
    """:func:`ddp_violations`' measurements: per job, its index, the job, max |two ranks − one process| per weight
    (one process computing the ranks' gradient, :class:`_RanksInOneProcess`) and the largest relative gap
    between that gradient and the whole batch's over the steps."""
    mp.spawn(_ddp_worker, args=(_free_port(), jobs, str(folder), broken_shard), nprocs=DDP_RANKS, join=True)
    out = []
    for i, job in enumerate(jobs):
        ddp = torch.load(Path(folder) / f"job_{i}.pt", weights_only=True)
        world = _RanksInOneProcess()
        one = job.train(world=world).weights
        differences = {name: float((ddp[name] - w).abs().max()) if ddp[name].shape == w.shape else math.inf
                       for name, w in one.items()}
        out.append((i, job, differences, max(world.gaps)))
    return out
