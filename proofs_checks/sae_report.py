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
from dictcheck.empirics.io.formats import load_any_sae, source_name
from dictcheck.empirics.io.sae_folder import folder_names, training_architecture_of
from dictcheck.empirics.io.saelens import SaeConfig
from dictcheck.proofs_checks.cli.inputs import CODES_TOL_RANGE, checked_lambda, checked_range
from dictcheck.proofs_checks.dictionary_report import summary
from dictcheck.proofs_checks.sae_budget import available_memory, estimate_memory, refuse_if_too_large
from dictcheck.solvers.atom_rows import AtomRows
from dictcheck.solvers.decoder_geometry import ANTIPODAL_COSINE, decoder_geometry
from dictcheck.proofs_checks.sae_polish import PolishInputs, PolishSettings, polish_report, polish_split, write_polished
from dictcheck.solvers.devices import resolve_device
from dictcheck.solvers.dictionary_check import UNIT_NORM_RTOL, DictionaryCheck, require_exact
from dictcheck.solvers.hull_distance import hull_candidate_distances
from dictcheck.solvers.lam_search import lam_for_l0
from dictcheck.solvers.lasso_codes import CodeSolver
from dictcheck.solvers.medians import huber_median
from dictcheck.solvers.new_atom_search import best_of_candidates, search_starts
from dictcheck.solvers.reductions import LOCAL, Reduction
from dictcheck.solvers.stream_diagnostics import (
    SparseCodes,
    batch_size_for,
    candidate_gains,
    column_batches,
    stream_diagnostics,
)
from dictcheck.theory.certificate import certified_gap
from dictcheck.theory.objective import check_lam

__all__ = ["ANTIPODAL_COSINE", "DENSE_FIRING", "SaeCheckSettings", "sae_report"]

DENSE_FIRING = 0.5
#: New-atom candidates (the best on the residual sample) whose gain is streamed over every token; an
#: unrefined antipode start's gain over every token is its ``antipode_gain``, reported anyway.
NEW_ATOM_CANDIDATES = 64
#: Starts refined by the new-atom search (solvers.new_atom_search.search_starts' default).
_REFINED_STARTS = 32
#: Bytes of the encoder pass's dense (batch, d_sae) arrays at a time (pre-activations, codes, their float64
#: copies): the encoder batch is the token batch or fewer.
_ENCODER_BYTES = 512 << 20


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
    the codes, only the time). ``latent_block``: atoms per block of the screened products with all atoms
    (None: blocks of about 256 MiB of products)."""

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
    latent_block: int | None = None

    def __post_init__(self) -> None:
        """Every field checked before any work (ValueError, one line, naming the field and its CLI flag: the
        API and ``check-sae`` say the same thing)."""
        if not (self.lam is None or self.lam == "auto"):
            checked_lambda(self.lam, "lam (--lam)")
        for name in ("hull_atoms", "hull_tokens", "polish_iters", "auto_tokens", "search_tokens"):
            _count(getattr(self, name), name)
        for name in ("batch_size", "polish_tokens", "latent_block"):
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




def resolve_lam(directory: str, model: Featurizer, cfg: SaeConfig, src: RowSource, lam: float | str | None,
                solver: CodeSolver, *, auto_tokens: int = 4096, tol: float = 1e-8, reduce: Reduction = LOCAL,
                token_range: tuple[int, int] | None = None) -> tuple[float, str, dict[str, Any]]:
    """(λ, its source, details) for ``check-sae``'s ``--lam`` (module docstring): a number is ``given``; None is the
    folder's λ of an L1 SAE (``folder``), else ``auto``; ``"auto"``: the λ at which the exact codes of the unit atoms
    of ``solver`` are as sparse as the SAE's own codes on ``auto_tokens`` evenly spaced tokens of ``src``. Over
    several processes (``reduce``) each reads the sample's tokens in its ``token_range`` and the bisection uses the
    whole sample's L0. ValueError for an L1 SAE without a λ and none given, and for a λ that is not a positive
    finite number."""
    info: dict[str, Any] = {}
    if isinstance(lam, (int, float)) and not isinstance(lam, bool):
        value, source = float(lam), "given"
    else:
        trained = training_architecture_of(cfg)  # its objective and where its λ is recorded
        folder_lam, why = trained.lam_from_folder(cfg)
        if lam is None and folder_lam is not None:
            value, source, info["note"] = folder_lam, "folder", why
        elif lam is None and trained.trains_objective_1:
            raise ValueError(f"{directory}: {why}; give --lam (λ of objective (1)) or --lam auto")
        else:
            lo, hi = (0, src.n_rows) if token_range is None else token_range
            idx = src.sample_indices(auto_tokens)
            sample = src.rows_at(idx[(idx >= lo) & (idx < hi)])
            step = encoder_batch(max(1, sample.shape[0]), solver.atoms.n_atoms)
            l0_count = sum(int(np.count_nonzero(_encoder_pass(model, sample[i:i + step])[0]))
                           for i in range(0, sample.shape[0], step))
            x_in = model.input_normalisation.apply(torch.from_numpy(sample))[0].numpy().T
            target = float(reduce.sum(np.array([l0_count], dtype=np.float64))[0]) / idx.size
            b = model.b_dec.detach().double().numpy()
            found = lam_for_l0(solver.atoms, x_in, b, target, tol=tol, solver=solver, reduce=reduce)
            value, source = found.lam, "auto"
            info = {"target_l0": target, "sample_l0_exact": found.l0, "sample_tokens": int(idx.size),
                    "bisection_steps": found.iterations, "lam_max": found.lam_max,
                    "note": "λ at which the exact codes' mean L0 equals the SAE's on an evenly spaced sample"}
    return check_lam(value, "λ"), source, info


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


def encoder_batch(batch: int, d_sae: int) -> int:
    """Tokens per encoder call: ``batch``, or fewer so its dense (tokens, d_sae) arrays stay near _ENCODER_BYTES."""
    return int(max(1, min(batch, _ENCODER_BYTES // (32 * max(d_sae, 1)))))


def _first_pass(model: Featurizer, src: RowSource, solver: CodeSolver, b: NDArray, lam: float,
                settings: SaeCheckSettings, batch: int, log: Callable[[str], None],
                timings: dict[str, float], reduce: Reduction, n_total: int, sample_cols: NDArray) -> _FirstPass:
    """The SAE's codes and output, the metrics and the encoder's objective, streamed over this process's tokens
    ``src`` (encoder batches sized to d_sae); then the exact codes of its decoder on them in one call,
    warm-started from the encoder's supports when ``settings.warm_start``. Sums over tokens are combined by
    ``reduce`` (``n_total`` tokens in all)."""
    t = time.perf_counter()
    atoms = solver.atoms
    N, D, d_z = src.n_rows, src.dim, atoms.n_atoms
    x_sum = np.zeros(D)
    for _, rows in src.batches(batch):
        x_sum += rows.sum(axis=0)
    metrics = StreamingMetrics(reduce.sum(x_sum) / n_total, d_z)
    X_in = np.empty((D, N))
    encoder_parts: list[SparseCodes] = []
    enc_sum, signed = 0.0, False
    norm = model.input_normalisation
    bar = _bar(settings.progress, N, "pass 1: SAE codes")
    for start, rows in src.batches(encoder_batch(batch, d_z)):
        z_raw, z_unit, x_hat = _encoder_pass(model, rows)
        x_in = norm.apply(torch.from_numpy(rows))[0].numpy().T  # (D, B), float64
        X_in[:, start:start + rows.shape[0]] = x_in
        metrics.update(rows, x_hat, z_raw)
        encoder_parts.append(SparseCodes.from_dense(np.abs(z_raw.T), offset=start))
        signed = signed or bool(np.any(z_raw < 0))
        r_enc = x_in - b[:, None] - SparseCodes.from_dense(z_unit.T).decode(atoms)  # sparse decode (k ≪ d_z)
        enc_sum += float(np.sum(r_enc * r_enc) + 2.0 * lam * np.abs(z_unit).sum())
        bar.update(rows.shape[0])
    bar.close()
    encoder = SparseCodes.concatenate(encoder_parts, N, d_z)
    parts = reduce.gather(metrics)
    for other in parts[1:]:
        parts[0] = parts[0].merged(other)
    try:
        metric_values: dict[str, Any] = parts[0].result()
    except ValueError as exc:  # e.g. zero-variance data: the theory checks still stand
        metric_values = {"metrics_error": str(exc)}
    timings["encoder_pass"] = time.perf_counter() - t
    t = time.perf_counter()
    ex = solver.codes(X_in, b, lam, tol=settings.tol, sparse_output=True, progress=settings.progress,
                      init=encoder.to_matrix() if settings.warm_start else None)
    timings["exact_codes"] = time.perf_counter() - t
    require_exact(ex, "the exact codes of the SAE's decoder")
    kkt = float(reduce.max(np.array([ex.kkt_violation]))[0])
    log(f"pass 1 done: {n_total} tokens, exact codes' KKT violation {kkt:.2e}")
    totals = reduce.sum(np.concatenate([[enc_sum, encoder.nnz, float(signed)],
                                        np.bincount(encoder.atoms, minlength=d_z).astype(np.float64)]))
    return _FirstPass(codes=SparseCodes.from_matrix(ex.Z), X_in=X_in, encoder_objective_sum=float(totals[0]),
                      signed=bool(totals[2] > 0), l0_sae=float(totals[1]) / n_total, firing=totals[3:] / n_total,
                      kkt_violation=kkt, metrics=metric_values, sample_cols=sample_cols)


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


def _token_range(n: int, reduce: Reduction) -> tuple[int, int]:
    """This process's contiguous share of n tokens: [n·r/P, n·(r+1)/P)."""
    return n * reduce.rank // reduce.size, n * (reduce.rank + 1) // reduce.size


def sae_report(directory: str | Any, data: Any, settings: SaeCheckSettings | None = None,
               log: Callable[[str], None] | None = None, reduce: Reduction = LOCAL) -> dict[str, Any]:
    """Everything ``check-sae`` reports (module docstring): the JSON object of ``check-sae --json``.

    ``directory``: an SAE folder, or an SAE object in memory (:func:`dictcheck.empirics.io.formats.load_any_sae`).
    ``data``: an (N, D) array, an ``.npy`` path or an activation store folder, one token per row. With ``reduce``
    over P processes (``check-sae --nproc P`` or torchrun) each process takes a contiguous 1/P of the tokens,
    every sum over tokens is combined (:class:`~dictcheck.solvers.reductions.Reduction`), λ auto's bisection
    and the samples are those of all tokens, the per-atom work is split by blocks of atoms, and the wide limit,
    the hull distances and polishing see all tokens (gathered); every process returns the report of all
    tokens, equal to one process's up to the order of floating-point sums.
    ValueError (one line; :class:`SaeFormatError` for the folder) for input it cannot check."""
    s = settings or SaeCheckSettings()
    say = log or (lambda msg: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    model, cfg, fmt = load_any_sae(directory, mmap=True)
    directory = source_name(directory)
    arch = architecture(model.arch)
    if arch.family != "sae":
        raise ValueError(f"{directory}: check-sae checks linear SAEs; architecture {model.arch!r} is a {arch.family} "
                         "featurizer")
    src_all = open_rows(data)
    if src_all.dim != cfg.d_in:
        raise ValueError(f"data have D = {src_all.dim} columns but the SAE has d_in = {cfg.d_in}")
    N = src_all.n_rows
    if s.polish and polish_split(N, s.polish_holdout, s.polish_tokens)[0].size == 0:
        raise ValueError(f"polish_holdout (--polish-holdout) {s.polish_holdout:g} holds out every one of the "
                         f"{N} tokens: none is left to polish on")
    first_token, last_token = _token_range(N, reduce)
    src = src_all.part(first_token, last_token)

    def local(idx: NDArray[np.int64]) -> NDArray[np.int64]:
        return idx[(idx >= first_token) & (idx < last_token)] - first_token

    W_dec = model.W_dec.detach().cpu().numpy()  # (d_sae, d_in) in the model's dtype, not copied
    try:
        atoms = AtomRows.unit_rows_of(W_dec, resolve_device(s.device))
    except ValueError as exc:
        raise ValueError(f"{directory}: decoder rows: {exc}") from None
    if s.latent_block is not None:
        atoms.block_atoms = s.latent_block
    norms = 1.0 / atoms.scale
    b = model.b_dec.detach().double().numpy()
    d_z = atoms.n_atoms
    batch = s.batch_size or batch_size_for(src.n_rows)
    estimate = estimate_memory(d_z, cfg.d_in, N if reduce.size == 1 else 2 * src.n_rows + N, W_dec.itemsize,
                               W_dec.dtype == np.float32, batch, encoder_batch(batch, d_z), getattr(model, "k", None),
                               s.latent_block, s.device)
    refuse_if_too_large(estimate, available_memory(), d_sae=d_z, batch=batch, encoder_batch=encoder_batch(batch, d_z),
                        latent_block=s.latent_block)
    solver = CodeSolver(atoms=atoms)
    workers = torch.get_num_threads()
    timings["load"] = time.perf_counter() - t0

    t = time.perf_counter()
    lam, lam_source, lam_info = resolve_lam(directory, model, cfg, src_all, s.lam, solver, auto_tokens=s.auto_tokens,
                                            tol=s.tol, reduce=reduce, token_range=(first_token, last_token))
    timings["lam"] = time.perf_counter() - t
    say(f"λ = {lam:.6g} ({lam_source})")

    stride = max(1, N // max(s.search_tokens, 1))
    search_cols = np.arange(0, N, stride)[:s.search_tokens]
    first = _first_pass(model, src, solver, b, lam, s, batch, say, timings, reduce, N, local(search_cols))

    t = time.perf_counter()
    cols = first.sample_cols
    streamed = stream_diagnostics(atoms, first.codes, b, column_batches(first.X_in, batch), lam, sample_points=cols,
                                  workers=workers, reduce=reduce)
    diag = streamed.diagnostics
    timings["diagnostics"] = time.perf_counter() - t

    t = time.perf_counter()  # new-atom starts on the residual sample; the antipodes' sample gains from the pass above
    top = np.sort(np.argsort(-streamed.sample_antipode_gains, kind="stable")[:_REFINED_STARTS + NEW_ATOM_CANDIDATES])
    R_sample = np.concatenate(reduce.gather(first.X_in[:, cols] - b[:, None] - first.codes.decode_points(atoms, cols)),
                              axis=1)
    labels, U, sample_gains = search_starts(R_sample, lam, antipodes=(top, atoms.unit_rows(top).T,
                                                                      streamed.sample_antipode_gains[top]),
                                            n_refine=_REFINED_STARTS)
    keep = np.sort(np.argsort(-sample_gains, kind="stable")[:NEW_ATOM_CANDIDATES])  # the rest: antipode_gain covers them
    labels, U = [labels[i] for i in keep], U[:, keep]
    gains = candidate_gains(atoms, first.codes, b, column_batches(first.X_in, batch), lam, U, reduce=reduce)
    search = best_of_candidates(labels, U, gains, N)
    timings["new_atom_search"] = time.perf_counter() - t

    t = time.perf_counter()
    X_all = first.X_in if reduce.size == 1 else np.concatenate(reduce.gather(first.X_in), axis=1)
    optimum = huber_median(X_all, lam).objective
    gap = certified_gap(diag.objective, b, X_all, lam, learned_bias=False)
    timings["wide_limit"] = time.perf_counter() - t

    t = time.perf_counter()
    geometry = decoder_geometry(atoms, ANTIPODAL_COSINE, workers=workers, reduce=reduce)
    timings["decoder_geometry"] = time.perf_counter() - t

    hull = None
    if s.hull:  # the QPs of docs/theory.md §8 Q1: on the atoms where (5) is violated most, on a token sample
        t = time.perf_counter()
        hull_cols = np.unique(np.linspace(0, N - 1, min(N, s.hull_tokens)).round().astype(np.int64))
        worst = np.argsort(-np.nan_to_num(diag.hull_per_atom, nan=-1.0), kind="stable")[:s.hull_atoms]
        Z_hull = np.concatenate(reduce.gather(first.codes.to_dense_points(local(hull_cols))), axis=1)
        hull = hull_candidate_distances(atoms.columns(), Z_hull, b, X_all[:, hull_cols], lam, tau_act=diag.tau_act,
                                        atoms=worst)
        timings["hull"] = time.perf_counter() - t

    t = time.perf_counter()
    report = summary(DictionaryCheck(
        W=atoms, column_norms=norms, renormalised=bool(np.any(np.abs(norms - 1) > UNIT_NORM_RTOL)), b=b,
        bias_mode="b_dec", codes_kkt_violation=first.kkt_violation, diagnostics=diag, best_new_atom=search,
        hull=hull, wide_gap=diag.objective - optimum, certified_gap=gap.certified_gap,
        seconds=time.perf_counter() - t0))
    encoder_objective = first.encoder_objective_sum / N
    report.update(
        **folder_names(cfg, model.arch), format=fmt, d_in=cfg.d_in, d_sae=cfg.d_sae, n_tokens=N, data=src_all.name,
        lam=lam, lam_source=lam_source, lam_details=lam_info,
        l0_sae=first.l0_sae, l0_exact=float(reduce.sum(np.array([first.codes.nnz], dtype=np.float64))[0]) / N,
        signed_codes=first.signed,
        encoder_objective=None if first.signed else encoder_objective,
        amortisation_gap=None if first.signed else encoder_objective - diag.objective,
        encoder_firing_fraction=first.firing.tolist(),
        dense_latents=[int(d) for d in np.flatnonzero(first.firing > DENSE_FIRING)],
        antipodal_pairs=geometry.pairs.tolist(),
        metrics=first.metrics,
        normalisation=model.input_normalisation.mode,
        notes=[n for n in (model.input_normalisation.note,) if n],
    )
    report["n_processes"] = reduce.size
    timings["report"] = time.perf_counter() - t
    if s.polish:  # on the first process, with every token; the others wait for its result
        t = time.perf_counter()
        columns, held_out = polish_split(N, s.polish_holdout, s.polish_tokens)
        n_polish = int(columns.size)
        if reduce.rank == 0:  # on the first process, with every token; the others wait for its result
            inputs = PolishInputs(directory=str(directory), model=model, cfg=cfg, fmt=fmt, lam=lam,
                                  lam_source=lam_source, lam_details=lam_info, src=src_all, X_in=X_all, columns=columns,
                                  held_out=held_out)
            block, fit = polish_report(inputs, max_sweeps=s.polish_iters, tol=s.tol, device=str(resolve_device(s.device)), log=say)
            if s.polish_out is not None:
                write_polished(s.polish_out, inputs, block, fit, s.polish_fit, log=say)
                block["folder"] = str(s.polish_out)
        report["polish"] = reduce.gather(block if reduce.rank == 0 else None)[0]
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
