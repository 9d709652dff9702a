"""The report of ``dictcheck check-sae``: a trained SAE folder against the theory, at real sizes.

For an SAE folder of any format dictcheck reads (SAELens / dictcheck, sparsify, dictionary_learning:
:func:`dictcheck.empirics.io.formats.load_any_sae`, with SAELens' semantics for its options) and data
read a batch at a time (an ``.npy`` file memory-mapped, an activation store, or an array):

* **λ** (docs/theory.md §1, §7): given; else the folder's, for SAEs trained on objective (1) (dictcheck's
  ``metadata.dictcheck.lam``, or SAELens' ``l1_coefficient`` c with λ = c/2: SAELens minimises
  mean_t[‖x − x̂‖² + c·Σ_d z_d‖w_d‖], which with unit atoms is objective (1) with 2λ = c); else ``auto``
  (:func:`dictcheck.solvers.lam_search.lam_for_l0`: the λ at which the exact codes are as sparse as the
  SAE's own codes, on an evenly spaced sample of the tokens).
* **pass 1** (streamed): the SAE's codes and output; the exact non-negative lasso codes of its decoder's
  unit atoms at its own ``b_dec`` (kept sparse); the encoder's objective (1) for the amortisation gap
  (non-negative codes only); the reconstruction metrics of docs/ecosystem.md §2 on the raw tokens.
* **pass 2** (streamed): every diagnostic of docs/theory.md §6 (:mod:`dictcheck.solvers.stream_diagnostics`)
  and the exact gain of the new-atom candidates, found on a sample of the residuals (§3 S6).
* the wide-limit optimum (Huber median of the points, §4.3) and the certified gap (§2.3).
* optional: the four hull distances of §8 Q1 (``hull``: one QP per atom, for the atoms where (5) is violated
  most, on a sample of the tokens), and ``polish`` (:mod:`dictcheck.proofs_checks.sae_polish`, shared with
  ``dictcheck polish``): :func:`dictcheck.solvers.polish.polish_dictionary` from the decoder and ``b_dec`` to the
  nearest stationary point on an evenly spaced sample of the tokens, objective (1) per sweep there and on held-out
  tokens, the per-atom cosines between the SAE's atoms and the polished ones; with ``polish_out`` also the polished
  SAE written as a folder.

Objective (1) and the conditions are evaluated in the SAE's input space (after ``normalize_activations``;
see :mod:`dictcheck.empirics.architectures.activation_normalisation` for the Decision). Memory: the codes (O(nnz)), a few
(D, d_z) accumulators, one batch, and the normalised tokens (8·N·D bytes, which the Huber median needs).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from numpy.typing import NDArray

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.metrics.reconstruction import StreamingMetrics
from dictcheck.empirics.data.row_source import RowSource, open_rows
from dictcheck.empirics.io.formats import load_any_sae
from dictcheck.empirics.io.saelens import SaeConfig
from dictcheck.proofs_checks.cli.inputs import CODES_TOL_RANGE, checked_lambda, checked_range
from dictcheck.proofs_checks.dictionary_report import summary
from dictcheck.proofs_checks.sae_polish import PolishInputs, PolishSettings, polish_report, polish_split, write_polished
from dictcheck.solvers.devices import resolve_device
from dictcheck.solvers.dictionary_check import UNIT_NORM_RTOL, DictionaryCheck, require_exact
from dictcheck.solvers.hull_distance import hull_candidate_distances
from dictcheck.solvers.lam_search import lam_for_l0
from dictcheck.solvers.lasso_codes import CodeSolver
from dictcheck.solvers.medians import huber_median
from dictcheck.solvers.new_atom_search import best_of_candidates, search_starts
from dictcheck.solvers.stream_diagnostics import SparseCodes, batch_size_for, column_batches, stream_diagnostics
from dictcheck.theory.certificate import certified_gap
from dictcheck.theory.scaling import LAMBDA_RANGE

__all__ = ["ANTIPODAL_COSINE", "DENSE_FIRING", "SaeCheckSettings", "antipodal_pairs", "sae_report"]

ANTIPODAL_COSINE = -0.9
DENSE_FIRING = 0.5
#: New-atom candidates (the best on the residual sample) whose gain is streamed over every token; an
#: unrefined antipode start's gain over every token is its ``antipode_gain``, reported anyway.
NEW_ATOM_CANDIDATES = 64


@dataclass(frozen=True)
class SaeCheckSettings:
    """How ``check-sae`` runs. ``lam``: a number, ``"auto"``, or None (the folder's λ, else auto).
    ``batch_size``: tokens per batch (None: sized so a batch's dense blocks stay near 512 MB).
    ``auto_tokens``: sample for ``auto``; ``search_tokens``: residual sample for the new-atom starts;
    ``hull``: the §8 Q1 distances for the ``hull_atoms`` atoms with the largest (5) violation on
    ``hull_tokens`` evenly spaced tokens;
    ``polish_tokens`` (None: all not held out) and ``polish_iters``: the sample and the sweep cap of ``polish``;
    ``polish_holdout``: the fraction of tokens kept out of polishing to measure it on unseen data; ``polish_out``:
    also write the polished SAE there (:func:`dictcheck.proofs_checks.sae_polish.write_polished`: the encoder fitted
    with the decoder frozen, the folder in the input's format, ``polish.json``), the fit as ``polish_fit`` says
    (:class:`~dictcheck.proofs_checks.sae_polish.PolishSettings`: steps, batch, lr, seed). ``tol``: relative
    KKT tolerance of the exact codes; ``warm_start``: start them from the encoder's supports (never changes
    the codes, only the time)."""

    lam: float | str | None = None
    batch_size: int | None = None
    hull: bool = False
    hull_atoms: int = 32
    hull_tokens: int = 2048
    polish: bool = False
    polish_tokens: int | None = None
    polish_iters: int = 300
    polish_holdout: float = 0.2
    polish_out: str | None = None
    polish_fit: PolishSettings = field(default_factory=PolishSettings)
    auto_tokens: int = 4096
    search_tokens: int = 8192
    tol: float = 1e-8
    warm_start: bool = True
    device: str = "cpu"
    progress: bool = False

    def __post_init__(self) -> None:
        """Every field checked before any work (ValueError, one line, naming the field and its CLI flag: the
        API and ``check-sae`` say the same thing)."""
        if not (self.lam is None or self.lam == "auto"):
            checked_lambda(self.lam, "lam (--lam)")
        for name in ("hull_atoms", "hull_tokens", "polish_iters", "auto_tokens", "search_tokens"):
            _count(getattr(self, name), name)
        for name in ("batch_size", "polish_tokens"):
            if getattr(self, name) is not None:
                _count(getattr(self, name), name)
        checked_range(self.polish_holdout, "polish_holdout (--polish-holdout)", 0.0, 1.0)
        if self.polish_holdout == 1.0:
            raise ValueError("polish_holdout (--polish-holdout) must be below 1 (1 holds every token out), got 1.0")
        checked_range(self.tol, "tol (--tol)", *CODES_TOL_RANGE)
        resolve_device(self.device, "device (--device)")


def _count(value: Any, name: str) -> int:
    """``value`` if it is an int ≥ 1 (ValueError naming the setting and its flag otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} (--{name.replace('_', '-')}) must be an int >= 1, got {value!r}")
    return int(value)


def antipodal_pairs(W_dec: NDArray, threshold: float = ANTIPODAL_COSINE, block: int = 2048) -> list[list[int]]:
    """Pairs [i, j], i < j, of decoder rows with cosine below ``threshold`` (rows in blocks: memory
    O(block·d_sae), never d_sae × d_sae)."""
    W_dec = np.asarray(W_dec, dtype=np.float64)
    norms = np.linalg.norm(W_dec, axis=1)
    unit = W_dec / np.where(norms > 0, norms, 1.0)[:, None]
    pairs: list[list[int]] = []
    for lo in range(0, unit.shape[0], block):
        cos = unit[lo:lo + block] @ unit.T
        i, j = np.nonzero(cos < threshold)
        keep = lo + i < j
        pairs.extend([int(a), int(c)] for a, c in zip(lo + i[keep], j[keep]))
    return sorted(pairs)


def _folder_lam(value: float, where: str) -> float:
    """A λ read from a folder, within :data:`dictcheck.theory.scaling.LAMBDA_RANGE` like every other λ
    (ValueError naming ``where`` otherwise)."""
    low, high = LAMBDA_RANGE
    if not low <= value <= high:
        raise ValueError(f"the folder's λ = {value:g} ({where}) is outside the accepted range [{low:g}, {high:g}]; "
                         "give --lam")
    return value


def _lam_from_folder(cfg: SaeConfig, arch: str) -> tuple[float | None, str]:
    """The folder's λ of objective (1) and where it comes from, or (None, why not); ValueError for a λ outside
    :data:`dictcheck.theory.scaling.LAMBDA_RANGE`."""
    if arch not in ("relu", "abs"):
        return None, f"a {arch} SAE is not trained on objective (1)"
    lam = cfg.dictcheck.get("lam")
    if isinstance(lam, (int, float)) and not isinstance(lam, bool) and lam > 0:
        return _folder_lam(float(lam), "metadata.dictcheck.lam"), "metadata.dictcheck.lam"
    details = cfg.metadata.get("training_architecture_details")
    if isinstance(details, dict) and isinstance(details.get("l1_coefficient"), (int, float)):
        if details.get("lp_norm", 1.0) != 1.0:
            return None, f"SAELens trained it with an l{details['lp_norm']} penalty, not objective (1)'s l1"
        c = float(details["l1_coefficient"])
        if c > 0:
            return _folder_lam(c / 2, f"SAELens l1_coefficient c = {c:g}, λ = c/2"), (
                f"SAELens l1_coefficient c = {c:g}: its loss mean_t[‖x − x̂‖² + c·Σ_d z_d‖w_d‖] is "
                "objective (1) with unit atoms and 2λ = c")
    return None, "the folder records no λ (no metadata.dictcheck.lam, no SAELens l1_coefficient)"


def resolve_lam(directory: str, model: Featurizer, cfg: SaeConfig, src: RowSource, lam: float | str | None,
                solver: CodeSolver, *, auto_tokens: int = 4096, tol: float = 1e-8) -> tuple[float, str, dict[str, Any]]:
    """(λ, its source, details) for ``check-sae``'s ``--lam`` (module docstring): a number is ``given``; None is the
    folder's λ of an L1 SAE (``folder``), else ``auto``; ``"auto"``: the λ at which the exact codes of the unit atoms
    of ``solver`` are as sparse as the SAE's own codes on ``auto_tokens`` evenly spaced tokens. ValueError for an L1
    SAE without a λ and none given, and for a λ that is not a positive finite number."""
    info: dict[str, Any] = {}
    if isinstance(lam, (int, float)) and not isinstance(lam, bool):
        value, source = float(lam), "given"
    else:
        folder_lam, why = _lam_from_folder(cfg, model.arch)
        if lam is None and folder_lam is not None:
            value, source, info["note"] = folder_lam, "folder", why
        elif lam is None and architecture(model.arch).trains_objective_1:
            raise ValueError(f"{directory}: {why}; give --lam (λ of objective (1)) or --lam auto")
        else:
            sample = src.sample(auto_tokens)
            z_raw = _encoder_pass(model, sample)[0]
            x_in = model.input_normalisation.apply(torch.from_numpy(sample))[0].numpy().T
            target = float(np.count_nonzero(z_raw)) / sample.shape[0]
            b = model.b_dec.detach().double().numpy()
            found = lam_for_l0(solver.W, x_in, b, target, tol=tol, solver=solver)
            value, source = found.lam, "auto"
            info = {"target_l0": target, "sample_l0_exact": found.l0, "sample_tokens": int(sample.shape[0]),
                    "bisection_steps": found.iterations, "lam_max": found.lam_max,
                    "note": "λ at which the exact codes' mean L0 equals the SAE's on an evenly spaced sample"}
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"λ must be a positive finite number, got {value}")
    return value, source, info


def _encoder_pass(model: Featurizer, x: NDArray) -> tuple[NDArray, NDArray, NDArray]:
    """(raw codes, unit-atom codes, output in the raw space) of the SAE on raw tokens x (B, D), computed in
    the model's dtype as SAELens does, returned in float64. ValueError when that dtype cannot hold the tokens or
    the SAE's outputs on them (e.g. float32 beyond 3.4e38): the SAE itself cannot be run on such data."""
    dtype = model.W_dec.dtype
    with torch.no_grad():
        xt = torch.as_tensor(x, dtype=dtype)
        out = model(xt)
        z = out.codes
        if not (bool(torch.isfinite(xt).all()) and bool(torch.isfinite(z).all())
                and bool(torch.isfinite(out.x_hat).all())):
            raise ValueError(f"the SAE computes in {dtype}, whose range its codes or output leave on these tokens "
                             f"(|x| up to {float(np.max(np.abs(x))):.3g}): it cannot be run on them; rescale the data "
                             "(objective (1) is homogeneous: λ scales with it)")
        return (z.double().numpy(), model.unit_codes(z).double().numpy(), out.x_hat.double().numpy())


@dataclass
class _FirstPass:
    codes: SparseCodes
    X_in: NDArray  # (D, N) normalised tokens, float64
    encoder_objective_sum: float
    signed: bool
    l0_sae: float
    firing: NDArray
    kkt_violation: float
    metrics: dict[str, Any]
    sample_cols: NDArray  # indices of the residual sample


def _first_pass(model: Featurizer, src: RowSource, solver: CodeSolver, b: NDArray, lam: float,
                settings: SaeCheckSettings, batch: int, log: Callable[[str], None]) -> _FirstPass:
    """The SAE's codes and output, the metrics and the encoder's objective, streamed; then the exact codes of
    its decoder on all tokens in one call (the Gram matrix is built once), warm-started from the encoder's
    supports when ``settings.warm_start``."""
    W = solver.W
    N, D, d_z = src.n_rows, src.dim, W.shape[1]
    x_mean = np.zeros(D)
    for _, rows in src.batches(batch):
        x_mean += rows.sum(axis=0)
    metrics = StreamingMetrics(x_mean / N, d_z)
    X_in = np.empty((D, N))
    encoder_parts: list[SparseCodes] = []
    enc_sum, signed = 0.0, False
    norm = model.input_normalisation
    bar = _bar(settings.progress, N, "pass 1: SAE codes")
    for start, rows in src.batches(batch):
        z_raw, z_unit, x_hat = _encoder_pass(model, rows)
        x_in = norm.apply(torch.from_numpy(rows))[0].numpy().T  # (D, B), float64
        X_in[:, start:start + rows.shape[0]] = x_in
        metrics.update(rows, x_hat, z_raw)
        encoder_parts.append(SparseCodes.from_dense(np.abs(z_raw.T), offset=start))
        signed = signed or bool(np.any(z_raw < 0))
        r_enc = x_in - b[:, None] - np.asarray(sp.csr_array(z_unit) @ W.T).T  # sparse decode (k ≪ d_z)
        enc_sum += float(np.sum(r_enc * r_enc) + 2.0 * lam * np.abs(z_unit).sum())
        bar.update(rows.shape[0])
    bar.close()
    encoder = SparseCodes.concatenate(encoder_parts, N, d_z)
    try:
        metric_values: dict[str, Any] = metrics.result()
    except ValueError as exc:  # e.g. zero-variance data: the theory checks still stand
        metric_values = {"metrics_error": str(exc)}
    ex = solver.codes(X_in, b, lam, tol=settings.tol, sparse_output=True, progress=settings.progress,
                      init=encoder.to_matrix() if settings.warm_start else None)
    require_exact(ex, "the exact codes of the SAE's decoder")
    log(f"pass 1 done: {N} tokens, exact codes' KKT violation {ex.kkt_violation:.2e}")
    stride = max(1, N // max(settings.search_tokens, 1))
    return _FirstPass(codes=SparseCodes.from_matrix(ex.Z), X_in=X_in, encoder_objective_sum=enc_sum,
                      signed=signed, l0_sae=encoder.nnz / N, firing=np.bincount(encoder.atoms, minlength=d_z) / N,
                      kkt_violation=ex.kkt_violation, metrics=metric_values,
                      sample_cols=np.arange(0, N, stride)[:settings.search_tokens])


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(enabled: bool, total: int, desc: str) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="tok", unit_scale=True, desc=desc, dynamic_ncols=True)


def sae_report(directory: str, data: Any, settings: SaeCheckSettings | None = None,
               log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Everything ``check-sae`` reports (module docstring): the JSON object of ``check-sae --json``.

    ``data``: an (N, D) array, an ``.npy`` path or an activation store folder, one token per row.
    ValueError (one line; :class:`SaeFormatError` for the folder) for input it cannot check."""
    s = settings or SaeCheckSettings()
    say = log or (lambda msg: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    model, cfg, fmt = load_any_sae(directory)
    arch = architecture(model.arch)
    if arch.family != "sae":
        raise ValueError(f"{directory}: check-sae checks linear SAEs; architecture {model.arch!r} is a {arch.family} "
                         "featurizer")
    src = open_rows(data)
    if src.dim != cfg.d_in:
        raise ValueError(f"data have D = {src.dim} columns but the SAE has d_in = {cfg.d_in}")
    if s.polish and polish_split(src.n_rows, s.polish_holdout, s.polish_tokens)[0].size == 0:
        raise ValueError(f"polish_holdout (--polish-holdout) {s.polish_holdout:g} holds out every one of the "
                         f"{src.n_rows} tokens: none is left to polish on")
    W_dec = model.W_dec.detach().double().numpy()
    norms = np.linalg.norm(W_dec, axis=1)
    if np.any(norms == 0):
        raise ValueError(f"{directory}: decoder rows {np.flatnonzero(norms == 0).tolist()[:10]} are zero; the "
                         "dictionary cannot be normalised")
    W = (W_dec / norms[:, None]).T  # (D, d_z) unit atoms
    b = model.b_dec.detach().double().numpy()
    N, d_z = src.n_rows, W.shape[1]
    batch = s.batch_size or batch_size_for(d_z, N)
    solver = CodeSolver(W, device=resolve_device(s.device))
    timings["load"] = time.perf_counter() - t0

    t = time.perf_counter()
    lam, lam_source, lam_info = resolve_lam(directory, model, cfg, src, s.lam, solver, auto_tokens=s.auto_tokens,
                                            tol=s.tol)
    timings["lam"] = time.perf_counter() - t
    say(f"λ = {lam:.6g} ({lam_source})")

    t = time.perf_counter()
    first = _first_pass(model, src, solver, b, lam, s, batch, say)
    timings["pass1_codes"] = time.perf_counter() - t

    t = time.perf_counter()
    cols = first.sample_cols
    labels, U, sample_gains = search_starts(first.X_in[:, cols] - b[:, None] - first.codes.decode_points(W, cols),
                                            lam, W)
    keep = np.sort(np.argsort(-sample_gains, kind="stable")[:NEW_ATOM_CANDIDATES])  # the rest: antipode_gain covers them
    labels, U = [labels[i] for i in keep], U[:, keep]
    timings["new_atom_search"] = time.perf_counter() - t

    t = time.perf_counter()
    streamed = stream_diagnostics(W, first.codes, b, column_batches(first.X_in, batch), lam, candidates=U,
                                  device=resolve_device(s.device))
    diag = streamed.diagnostics
    search = best_of_candidates(labels, U, streamed.candidate_gains, N)
    timings["diagnostics"] = time.perf_counter() - t

    t = time.perf_counter()
    optimum = huber_median(first.X_in, lam).objective
    gap = certified_gap(diag.objective, b, first.X_in, lam, learned_bias=False)
    timings["wide_limit"] = time.perf_counter() - t

    hull = None
    if s.hull:  # the QPs of docs/theory.md §8 Q1: on the atoms where (5) is violated most, on a token sample
        t = time.perf_counter()
        cols = np.unique(np.linspace(0, N - 1, min(N, s.hull_tokens)).round().astype(np.int64))
        atoms = np.argsort(-np.nan_to_num(diag.hull_per_atom, nan=-1.0), kind="stable")[:s.hull_atoms]
        hull = hull_candidate_distances(W, first.codes.to_dense_points(cols), b, first.X_in[:, cols], lam,
                                        tau_act=diag.tau_act, atoms=atoms)
        timings["hull"] = time.perf_counter() - t

    report = summary(DictionaryCheck(
        W=W, column_norms=norms, renormalised=bool(np.any(np.abs(norms - 1) > UNIT_NORM_RTOL)), b=b,
        bias_mode="b_dec", codes_kkt_violation=first.kkt_violation, diagnostics=diag, best_new_atom=search,
        hull=hull, wide_gap=diag.objective - optimum, certified_gap=gap.certified_gap,
        seconds=time.perf_counter() - t0))
    encoder_objective = first.encoder_objective_sum / N
    report.update(
        arch=model.arch, format=fmt, d_in=cfg.d_in, d_sae=cfg.d_sae, n_tokens=N, data=src.name,
        lam=lam, lam_source=lam_source, lam_details=lam_info,
        l0_sae=first.l0_sae, l0_exact=first.codes.nnz / N,
        signed_codes=first.signed,
        encoder_objective=None if first.signed else encoder_objective,
        amortisation_gap=None if first.signed else encoder_objective - diag.objective,
        encoder_firing_fraction=first.firing.tolist(),
        dense_latents=[int(d) for d in np.flatnonzero(first.firing > DENSE_FIRING)],
        antipodal_pairs=antipodal_pairs(W_dec),
        metrics=first.metrics,
        normalisation=model.input_normalisation.mode,
        notes=[n for n in (model.input_normalisation.note,) if n],
    )
    if s.polish:
        t = time.perf_counter()
        columns, held_out = polish_split(N, s.polish_holdout, s.polish_tokens)
        n_polish = int(columns.size)
        inputs = PolishInputs(directory=str(directory), model=model, cfg=cfg, fmt=fmt, lam=lam, lam_source=lam_source,
                              lam_details=lam_info, src=src, X_in=first.X_in, columns=columns, held_out=held_out)
        report["polish"], fit = polish_report(inputs, max_sweeps=s.polish_iters, tol=s.tol, device=str(resolve_device(s.device)), log=say)
        if s.polish_out is not None:
            write_polished(s.polish_out, inputs, report["polish"], fit, s.polish_fit, log=say)
            report["polish"]["folder"] = str(s.polish_out)
        if n_polish < 4 * d_z:
            report["notes"].append(f"polishing used {n_polish} tokens for {d_z} atoms: with fewer than ~4 tokens per "
                                   "atom, atoms can specialise to single tokens, so the polished point overfits")
        timings["polish"] = time.perf_counter() - t
    report["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    report["verdict"] = verdict_text(report)
    return report


def verdict_text(r: dict[str, Any]) -> str:
    """A short paragraph a researcher can quote: what was checked and how far from stationary it is."""
    where = (f"on {r['n_tokens']} tokens at λ = {r['lam']:.4g} ({r['lam_source']}"
             + (f": exact-code L0 {r['l0_exact']:.1f} vs the SAE's {r['l0_sae']:.1f}" if r["lam_source"] == "auto"
                else "") + ")")
    state = ("a stationary point of objective (1)" if r["stationary"]
             else f"not a stationary point of objective (1) (fails {', '.join(r['failed_conditions'])})")
    text = (f"This {r['arch']} SAE ({r['d_sae']} latents, D = {r['d_in']}) is {state} {where}. "
            f"With its decoder fixed, exact codes reach objective {r['objective']:.6g}")
    if r.get("amortisation_gap") is not None:
        pct = 100.0 * r["amortisation_gap"] / r["objective"] if r["objective"] else 0.0
        text += f"; its encoder's codes cost {pct:.1f}% more (amortisation gap {r['amortisation_gap']:.4g})"
    text += (f". Atom stationarity S1 is violated by up to {r['stationarity_violation']:.3g} and KKT by "
             f"{r['kkt_violation']:.3g} (both in units where 0 is stationary and 1 is an atom as far from its "
             "residuals' mean, or a correlation a whole λ beyond the threshold).")
    p = r.get("polish")
    if p:
        text += (f" Polishing on {p['n_tokens']} tokens lowers the objective by {-p['objective_change_pct']:.2f}% to a "
                 f"point that is {'stationary' if p['stationary'] else 'not yet stationary'}; the median atom keeps "
                 f"cosine {p['atom_cosine_quantiles']['0.5']:.3f} with its polished self "
                 f"(10% of atoms below {p['atom_cosine_quantiles']['0.1']:.3f}).")
        h = p.get("held_out")
        if h:
            text += (f" On {h['n_tokens']} held-out tokens the polished dictionary's objective changes by "
                     f"{h['objective_change_pct']:+.2f}%" + (" (worse: the polished point is fitted to its sample)."
                                                             if h["objective_change_pct"] > 0 else "."))
    return text
