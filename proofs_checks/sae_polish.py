"""Polished SAEs: an SAE's decoder and b_dec moved to the nearest stationary point of objective (1), an encoder
fitted to them, written back as a folder of the input's own format (``dictcheck polish``, ``check-sae --polish``;
docs/theory.md §7.1).

1. **Split** (:func:`polish_split`): an evenly spaced fraction of the tokens is held out; polishing and the
   encoder fit use (an evenly spaced subset of) the rest, so every "after" on held-out tokens is measured on
   data neither saw.
2. **Polish** (:func:`polish_report`): :func:`dictcheck.solvers.polish.polish_dictionary` from the decoder's unit
   atoms and b_dec at λ, with objective (1) per sweep on the polishing and the held-out tokens; the diagnostics of
   docs/theory.md §6 at the polished point; optionally checkpointed every few sweeps and resumed.
3. **Fit the encoder** (:func:`write_polished`): :func:`dictcheck.empirics.training.encoder_fit.fit_encoder` with the
   polished decoder and b_dec frozen, the SAE's own architecture and options (its k; for an SAE trained on
   objective (1), λ is the polishing λ; a JumpReLU keeps its thresholds), seeded and resumable.
4. **Write** the folder in the input's format (SAELens / dictcheck now; sparsify and dictionary_learning are
   refused by name before any work) and ``polish.json``: objective (1) per sweep, the held-out metrics of the SAE
   before and after (its own encoder; the fitted one) and of the exact codes of both decoders, the fit's steps.

Convergence is stated by two flags that answer different questions (docs/theory.md §7.1): ``converged``: the
descent stopped because no atom moved more than ``step_tol`` in a sweep (else it stopped at the sweep cap);
``stationary``: every condition of §6 holds within its tolerance (1e-6) at the polished point. ``convergence``
says which of the four combinations happened, in words.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from numpy.typing import NDArray

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.data.row_source import RowSource, open_rows
from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.empirics.io.formats import detect_format, load_any_sae
from dictcheck.empirics.io.sae_folder import save_sae
from dictcheck.empirics.io.saelens import SaeConfig
from dictcheck.empirics.io.safe_files import folder_lock
from dictcheck.empirics.metrics.reconstruction import StreamingMetrics
from dictcheck.empirics.training.encoder_fit import fit_encoder
from dictcheck.empirics.training.loop import TrainConfig
from dictcheck.solvers.atom_rows import AtomRows
from dictcheck.solvers.lasso_codes import CodeSolver, exact_codes
from dictcheck.solvers.polish import PolishResult, Sweep, polish_dictionary
from dictcheck.solvers.stream_diagnostics import SparseCodes, batch_size_for, column_batches, stream_diagnostics

__all__ = ["POLISH_FILE", "WRITABLE_FORMATS", "PolishInputs", "PolishSettings", "convergence_text", "polish_report",
           "polish_sae", "polish_split", "write_polished"]

POLISH_FILE = "polish.json"
#: Inside the output folder: the polishing checkpoint and the encoder fit's log and checkpoints.
WORK_DIR = "polish_work"
_STATE_FILE = "dictionary.npz"
_FIT_DIR = "encoder_fit"
#: In the fit's folder: the sha256 of the polished (W, b) it fits (a resumed fit with another decoder restarts).
_DECODER_STAMP = "decoder.sha256"
#: The descent's stopping rule (:func:`dictcheck.solvers.polish.polish_dictionary`'s default ``step_tol``).
STEP_TOL = 1e-10
#: Atoms listed as the ones that moved most under polishing.
TOP_MOVERS = 10
#: Folder formats a polished SAE can be written in (the input's own format).
WRITABLE_FORMATS = ("saelens",)


@dataclass(frozen=True)
class PolishSettings:
    """How ``dictcheck polish`` runs. ``lam``: a number, ``"auto"`` or None (the folder's λ for an SAE trained on
    objective (1), else auto; as ``check-sae``). ``holdout``: the fraction of tokens kept out of polishing and of
    the encoder fit; ``tokens``: how many of the rest polishing uses (None: all). ``sweeps``: the sweep cap;
    ``checkpoint_every``: sweeps between checkpoints of the polished dictionary. ``fit_steps``,
    ``fit_batch_size``, ``fit_lr`` (None: the architecture's default), ``encoder_init`` (``"tied"``: W_enc = W_decᵀ,
    b_enc = 0; ``"sae"``: the SAE's own encoder), ``seed``: the encoder fit. ``tol``: KKT
    tolerance of the exact codes (polishing uses min(tol, 1e-10)); ``auto_tokens``: sample of ``--lam auto``;
    ``batch_size``: tokens per batch when reading (None: sized for ~512 MB)."""

    lam: float | str | None = None
    holdout: float = 0.2
    tokens: int | None = None
    sweeps: int = 300
    checkpoint_every: int = 10
    fit_steps: int = 1000
    fit_batch_size: int = 1024
    fit_lr: float | None = None
    encoder_init: str = "tied"
    seed: int = 0
    tol: float = 1e-8
    auto_tokens: int = 4096
    batch_size: int | None = None
    device: str = "cpu"
    progress: bool = False


def polish_split(N: int, holdout: float, n_polish: int | None) -> tuple[NDArray, NDArray]:
    """(polishing tokens, held-out tokens): every token whose index falls in an evenly spaced ``holdout`` fraction
    is held out; polishing uses ``n_polish`` evenly spaced tokens of the rest (all of them when None)."""
    n_held = int(round(holdout * N)) if N > 1 else 0
    held = np.unique(np.linspace(0, N - 1, n_held).round().astype(np.int64)) if n_held else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(N), held)
    if n_polish is not None and n_polish < rest.size:
        rest = rest[np.unique(np.linspace(0, rest.size - 1, n_polish).round().astype(np.int64))]
    return rest, held


@dataclass(frozen=True)
class PolishInputs:
    """What polishing an SAE needs: the folder, its model, config and format, λ (and where it came from), the
    tokens read (``src``, raw rows) and in the SAE's input space (``X_in`` (D, N)), and the split."""

    directory: str
    model: Featurizer
    cfg: SaeConfig
    fmt: str
    lam: float
    lam_source: str
    lam_details: dict[str, Any]
    src: RowSource
    X_in: NDArray[np.float64]
    columns: NDArray[np.int64]
    held_out: NDArray[np.int64]

    @property
    def W(self) -> NDArray[np.float64]:
        """The decoder's unit atoms (D, d_z)."""
        W_dec = self.model.W_dec.detach().double().numpy()
        return (W_dec / np.linalg.norm(W_dec, axis=1, keepdims=True)).T

    @property
    def b(self) -> NDArray[np.float64]:
        return self.model.b_dec.detach().double().numpy()


def convergence_text(converged: bool, stationary: bool, sweeps: int, max_sweeps: int, last_move: float | None,
                     step_tol: float, failed: list[str]) -> str:
    """The polish's end in one sentence (module docstring: ``converged`` and ``stationary``)."""
    how = (f"stopped after {sweeps} sweeps because no atom moved more than {step_tol:g} (converged)" if converged
           else f"stopped at the cap of {max_sweeps} sweeps with atoms still moving up to "
                f"{last_move if last_move is not None else float('nan'):.2g} per sweep (not converged)")
    state = ("every condition of docs/theory.md §6 holds within 1e-6 there (stationary)" if stationary
             else f"the polished point is not yet stationary (fails {', '.join(failed)})")
    return f"Polishing {how}; {state}."


def _save_state(path: Path, W: NDArray, b: NDArray, sweeps: list[dict[str, Any]], converged: bool,
                before: tuple[float, float | None]) -> None:
    """The polishing checkpoint: atoms, bias, the per-sweep record, whether the descent converged, and the
    objectives at the start (written atomically)."""
    buf = io.BytesIO()
    np.savez(buf, W=W, b=b, sweeps=json.dumps(sweeps), converged=converged, before=json.dumps(list(before)))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())


def _load_state(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        return {"W": z["W"], "b": z["b"], "sweeps": json.loads(str(z["sweeps"])), "converged": bool(z["converged"]),
                "before": tuple(json.loads(str(z["before"])))}


def _digest(*arrays: NDArray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def polish_report(inp: PolishInputs, *, max_sweeps: int, tol: float = 1e-8, device: str = "cpu",
                  log: Callable[[str], None] | None = None, work: Path | None = None,
                  checkpoint_every: int = 10) -> tuple[dict[str, Any], PolishResult]:
    """Polish from the SAE's (W, b) on its polishing tokens and compare (the JSON ``polish`` of ``check-sae`` and
    ``polish.json``), with the polishing result. Objective (1) at exact codes is reported per sweep on the
    polishing tokens and on the held-out tokens (disjoint from them): a drop there is a better dictionary, not
    one fitted to its sample. With ``work``, the polished dictionary is checkpointed there every
    ``checkpoint_every`` sweeps and at the end, and a later call continues from the checkpoint up to its own
    ``max_sweeps`` (none after a converged descent)."""
    say = log or (lambda msg: None)
    lam, tol = inp.lam, min(tol, 1e-10)
    Xs = inp.X_in[:, inp.columns]
    Xh = inp.X_in[:, inp.held_out] if inp.held_out.size else None
    path = None if work is None else work / _STATE_FILE
    state = _load_state(path)
    if state is None:
        start = polish_dictionary(inp.W, inp.b, Xs, lam, max_iter=0, tol=tol, X_held_out=Xh)
        state = {"W": inp.W, "b": inp.b, "sweeps": [], "converged": False,
                 "before": (start.objective_before, start.held_out_before)}
    else:
        say(f"polish: resuming after sweep {len(state['sweeps'])} from {path}")
    sweeps: list[dict[str, Any]] = state["sweeps"]

    def on_state(sw: Sweep) -> None:
        sweeps.append({"sweep": len(sweeps) + 1, "objective": sw.objective, "objective_held_out": sw.objective_held_out,
                       "max_atom_move": sw.max_atom_move})
        say(f"polish sweep {len(sweeps)}/{max_sweeps}: objective {sw.objective:.6g}"
            + (f" (held out {sw.objective_held_out:.6g})" if sw.objective_held_out is not None else "")
            + f", largest atom move {sw.max_atom_move:.2e}")
        if path is not None and len(sweeps) % max(checkpoint_every, 1) == 0:
            _save_state(path, sw.W, sw.b, sweeps, False, state["before"])

    remaining = 0 if state["converged"] else max(0, max_sweeps - len(sweeps))
    fit = polish_dictionary(state["W"], state["b"], Xs, lam, max_iter=remaining, step_tol=STEP_TOL, tol=tol,
                            X_held_out=Xh, on_state=on_state)
    converged = fit.converged if remaining else state["converged"]
    if path is not None:
        _save_state(path, fit.W, fit.b, sweeps, converged, state["before"])
    fit = replace(fit, objective_before=state["before"][0], held_out_before=state["before"][1], converged=converged,
                  iterations=len(sweeps), history=tuple(r["objective"] for r in sweeps),
                  held_out_history=tuple(r["objective_held_out"] for r in sweeps) if Xh is not None else ())
    return _polish_block(inp, fit, sweeps, max_sweeps, tol, device), fit


def _pct(after: float, before: float) -> float:
    return 100.0 * (after - before) / before if before else 0.0


def _polish_block(inp: PolishInputs, fit: PolishResult, sweeps: list[dict[str, Any]], max_sweeps: int, tol: float,
                  device: str) -> dict[str, Any]:
    """The JSON ``polish`` block (module docstring)."""
    W, b, lam = inp.W, inp.b, inp.lam
    Xs = inp.X_in[:, inp.columns]
    cos = np.sum(W * fit.W, axis=0)
    after = stream_diagnostics(AtomRows.from_columns(fit.W, device), fit.codes, fit.b,
                               column_batches(Xs, batch_size_for(Xs.shape[1])), lam, learned_bias=True).diagnostics
    start_codes = SparseCodes.from_matrix(exact_codes(W, Xs, b, lam, tol=tol, sparse_output=True).Z)
    live_start, live_end = start_codes.mass() > 0, fit.codes.mass() > 0
    movers = np.argsort(cos, kind="stable")[:TOP_MOVERS]
    held: dict[str, Any] | None = None
    if inp.held_out.size:
        h_after = fit.held_out_history[-1] if fit.held_out_history else fit.held_out_before
        held = {"n_tokens": int(inp.held_out.size), "objective_before": fit.held_out_before,
                "objective_after": h_after, "objective_change_pct": _pct(h_after, fit.held_out_before)}
    last_move = sweeps[-1]["max_atom_move"] if sweeps else None
    return {
        "n_tokens": int(Xs.shape[1]),
        "objective_before": fit.objective_before,
        "objective_after": fit.objective_after,
        "objective_change_pct": _pct(fit.objective_after, fit.objective_before),
        "atom_cosines": cos.tolist(),
        "atom_cosine_quantiles": {q: float(np.quantile(cos, float(q))) for q in ("0.01", "0.1", "0.5")},
        "moved_most": [{"atom": int(d), "cosine": float(cos[d])} for d in movers],
        "died": [int(d) for d in np.flatnonzero(live_start & ~live_end)],
        "born": [int(d) for d in np.flatnonzero(~live_start & live_end)],
        "bias_shift_norm": float(np.linalg.norm(fit.b - b)),
        "sweeps": fit.iterations,
        "max_sweeps": max_sweeps,
        "converged": fit.converged,
        "stationary": after.stationary,
        "convergence": convergence_text(fit.converged, after.stationary, fit.iterations, max_sweeps, last_move,
                                        STEP_TOL, list(after.failed_checks)),
        "failed_conditions": list(after.failed_checks),
        "violations_after": {"kkt": after.kkt_violation, "stationarity": after.stationarity_violation,
                             "hull": after.hull_violation, "bias_identity": after.bias_identity_violation},
        "held_out": held,
        "per_sweep": sweeps,
    }


# ------------------------------------------------------------------------------------------------ the polished SAE

def _raw_rows(src: RowSource, idx: NDArray[np.int64]) -> NDArray[np.float32]:
    """Raw tokens ``idx`` (rows) of the source as float32, the dtype training uses."""
    return np.ascontiguousarray(np.asarray(src.data[idx], dtype=np.float32))


def _batch(d_sae: int) -> int:
    return max(1, min(4096, (1 << 24) // max(d_sae, 1)))


def sae_metrics(model: Featurizer, x: NDArray) -> dict[str, Any]:
    """docs/ecosystem.md §2 metrics of ``model`` (its own encoder, SAELens semantics) on raw tokens ``x`` (rows)."""
    mean = x.mean(axis=0, dtype=np.float64)
    metrics = StreamingMetrics(mean, int(model.d_sae))
    dtype = model.W_dec.dtype
    with torch.no_grad():
        for lo in range(0, x.shape[0], _batch(int(model.d_sae))):
            xb = torch.as_tensor(x[lo:lo + _batch(int(model.d_sae))], dtype=dtype)
            out = model(xb)
            metrics.update(xb.double().numpy(), out.x_hat.double().numpy(), out.codes.double().numpy())
    return metrics.result()


def exact_code_metrics(model: Featurizer, W: NDArray, b: NDArray, lam: float, x: NDArray, x_in: NDArray,
                       tol: float) -> dict[str, Any]:
    """Objective (1) of the unit atoms W (D, d_z) and bias b at their exact codes on tokens ``x_in`` (D, M) in the
    SAE's input space, and the §2 metrics of the reconstruction W z + b mapped back to raw tokens ``x`` (rows)
    through the SAE's input normalisation."""
    Z = sp.csc_array(exact_codes(W, x_in, b, lam, tol=tol, sparse_output=True).Z)
    recon_in = np.asarray(Z.T @ W.T) + b  # (M, D)
    r = x_in.T - recon_in
    objective = float((np.sum(r * r) + 2.0 * lam * Z.sum()) / x_in.shape[1])
    norm = model.input_normalisation
    metrics = StreamingMetrics(x.mean(axis=0, dtype=np.float64), W.shape[1])
    step = _batch(W.shape[1])
    for lo in range(0, x.shape[0], step):
        xb = torch.as_tensor(x[lo:lo + step], dtype=torch.float64)
        _, state = norm.apply(xb)
        x_hat = norm.invert(torch.from_numpy(recon_in[lo:lo + step]), state).numpy()
        metrics.update(xb.numpy(), x_hat, Z[:, lo:lo + step].T.toarray())
    return {"objective": objective, **metrics.result()}


def _fit_model(inp: PolishInputs, fit: PolishResult, encoder_init: str) -> Featurizer:
    """A fresh model of the SAE's architecture with the polished decoder (unit rows) and b_dec, the SAE's other
    weights (a JumpReLU's thresholds) and the folder's run-time fields, built in float32 for the fit. Its encoder
    starts ``"tied"`` (W_enc = W_decᵀ of the polished decoder, b_enc = 0: the usual SAE initialisation) or as the
    SAE's own (``"sae"``). An SAE trained on objective (1) gets the polishing λ as its sparsity coefficient."""
    arch = architecture(inp.model.arch)
    options = inp.model.arch_options
    if arch.trains_objective_1:
        options = arch.options({**options.to_dict(), "lam": inp.lam}, int(inp.model.d_sae))
    model = arch.build(inp.cfg.d_in, inp.cfg.d_sae, options, dtype=torch.float32)
    weights = {k: v.to(torch.float32) for k, v in inp.model.state_weights().items()}
    weights["W_dec"] = torch.as_tensor(fit.W.T, dtype=torch.float32)
    weights["b_dec"] = torch.as_tensor(fit.b, dtype=torch.float32)
    if encoder_init == "tied":
        weights["W_enc"] = weights["W_dec"].T.contiguous()
        weights["b_enc"] = torch.zeros_like(weights["b_enc"])
    elif encoder_init != "sae":
        raise ValueError(f"encoder_init must be 'tied' or 'sae', got {encoder_init!r}")
    model.load_state_weights(weights)
    model.load_arch_fields(inp.model.arch_fields())
    arch.apply_cfg_fields(model, inp.cfg)
    return model


def check_writable(directory: str) -> str:
    """The folder's format when a polished SAE can be written in it (ValueError naming the format otherwise)."""
    fmt = detect_format(directory)
    if fmt not in WRITABLE_FORMATS:
        raise ValueError(f"{directory}: writing a polished SAE in the {fmt} format is not implemented yet (only "
                         f"{', '.join(WRITABLE_FORMATS)}); nothing was done")
    return fmt


def _polished_cfg(inp: PolishInputs, info: dict[str, Any]) -> SaeConfig:
    """The input's own cfg.json with ``metadata.dictcheck.polish`` (and the λ of an SAE trained on objective (1))."""
    d = inp.cfg.to_dict()
    dc = dict(d["metadata"].get("dictcheck") or {})
    dc["polish"] = info
    if architecture(inp.model.arch).trains_objective_1:
        dc["lam"] = inp.lam
    d["metadata"]["dictcheck"] = dc
    return SaeConfig.from_dict(d)


def write_polished(destination: str | os.PathLike[str], inp: PolishInputs, block: dict[str, Any], fit: PolishResult,
                   settings: PolishSettings, *, log: Callable[[str], None] | None = None,
                   resume: bool = False) -> dict[str, Any]:
    """Fit the encoder to the polished decoder and b_dec (decoder frozen; its log and checkpoints in
    ``destination/polish_work/encoder_fit``, continued when ``resume``), measure the SAE and the exact codes before
    and after on the held-out tokens, and write ``destination`` as a folder of the input's format with
    ``polish.json`` (also returned). ``block`` is :func:`polish_report`'s JSON. The folder is written last, so a
    folder with ``polish.json`` is complete."""
    say = log or (lambda msg: None)
    out = Path(destination)
    fmt = check_writable(inp.directory)
    t0 = time.perf_counter()
    model = _fit_model(inp, fit, settings.encoder_init)
    train_rows = _raw_rows(inp.src, inp.columns)
    config = TrainConfig(steps=settings.fit_steps, batch_size=min(settings.fit_batch_size, train_rows.shape[0]),
                         lr=settings.fit_lr, seed=settings.seed, device=settings.device,
                         log_every=max(1, settings.fit_steps // 20), checkpoint_every=max(1, settings.fit_steps // 4))
    say(f"encoder fit: {settings.fit_steps} steps of {config.batch_size} tokens, decoder frozen")
    fit_dir = out / WORK_DIR / _FIT_DIR
    stamp = fit_dir / _DECODER_STAMP
    digest = _digest(fit.W, fit.b)
    if fit_dir.exists() and (not stamp.is_file() or stamp.read_text() != digest):
        say(f"encoder fit: {fit_dir} was fitted to another decoder; starting it again")
        shutil.rmtree(fit_dir)
    fit_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(stamp, digest.encode())
    result = fit_encoder(model, train_rows, config, fit_dir, resume=resume, progress=settings.progress)
    fit_seconds = time.perf_counter() - t0
    encoder_fit = {"steps": result.steps, "batch_size": config.batch_size, "lr": float(result.log[-1]["lr"])
                   if result.log else None, "seed": settings.seed, "init": settings.encoder_init, "resumed_from": result.resumed_from,
                   "final_loss": result.final_loss, "trained": list(architecture(model.arch).encoder_weights),
                   "n_tokens": int(train_rows.shape[0]), "log": result.log, "seconds": round(fit_seconds, 3)}
    held: dict[str, Any] = {"n_tokens": int(inp.held_out.size)}
    if inp.held_out.size:
        x_held, x_in_held = _raw_rows(inp.src, inp.held_out), inp.X_in[:, inp.held_out]
        tol = min(settings.tol, 1e-10)
        held.update(sae_before=sae_metrics(inp.model, x_held), sae_after=sae_metrics(model, x_held),
                    exact_codes_before=exact_code_metrics(inp.model, inp.W, inp.b, inp.lam, x_held, x_in_held, tol),
                    exact_codes_after=exact_code_metrics(model, fit.W, fit.b, inp.lam, x_held, x_in_held, tol))
    report = {
        "source": inp.directory, "format": fmt, "arch": inp.model.arch, "d_in": inp.cfg.d_in, "d_sae": inp.cfg.d_sae,
        "data": inp.src.name, "n_tokens": inp.src.n_rows, "lam": inp.lam, "lam_source": inp.lam_source,
        "lam_details": inp.lam_details, "polish": block, "encoder_fit": encoder_fit, "held_out": held,
        "output": str(out),
    }
    info = {"source": inp.directory, "lam": inp.lam, "lam_source": inp.lam_source, "sweeps": block["sweeps"],
            "converged": block["converged"], "stationary": block["stationary"],
            "encoder_fit_steps": result.steps, "report": POLISH_FILE}
    weights = {k: v.detach().cpu() for k, v in model.state_weights().items()}
    save_sae(out, weights, _polished_cfg(inp, info))
    atomic_write_bytes(out / POLISH_FILE, (json.dumps(_json_safe(report), indent=1) + "\n").encode())
    say(f"wrote the polished SAE to {out} ({fmt}) and {out / POLISH_FILE}")
    return report


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def read_polish_inputs(directory: str, data: Any, settings: PolishSettings,
                       log: Callable[[str], None] | None = None) -> PolishInputs:
    """Load the SAE, resolve λ (as ``check-sae``), read the tokens into the SAE's input space and split them."""
    from dictcheck.proofs_checks.sae_report import resolve_lam

    model, cfg, fmt = load_any_sae(directory)
    if architecture(model.arch).family != "sae":
        raise ValueError(f"{directory}: polish works on linear SAEs; architecture {model.arch!r} is a "
                         f"{architecture(model.arch).family} featurizer")
    src = open_rows(data)
    if src.dim != cfg.d_in:
        raise ValueError(f"data have D = {src.dim} columns but the SAE has d_in = {cfg.d_in}")
    W_dec = model.W_dec.detach().double().numpy()
    zero = np.flatnonzero(np.linalg.norm(W_dec, axis=1) == 0)
    if zero.size:
        raise ValueError(f"{directory}: decoder rows {zero.tolist()[:10]} are zero; the dictionary cannot be polished")
    W = (W_dec / np.linalg.norm(W_dec, axis=1, keepdims=True)).T
    lam, source, details = resolve_lam(directory, model, cfg, src, settings.lam, CodeSolver(W, device=settings.device),
                                       auto_tokens=settings.auto_tokens, tol=settings.tol)
    (log or (lambda msg: None))(f"λ = {lam:.6g} ({source})")
    X_in = np.empty((src.dim, src.n_rows))
    norm = model.input_normalisation
    for start, rows in src.batches(settings.batch_size or batch_size_for(src.n_rows)):
        X_in[:, start:start + rows.shape[0]] = norm.apply(torch.from_numpy(rows))[0].numpy().T
    columns, held = polish_split(src.n_rows, settings.holdout, settings.tokens)
    return PolishInputs(directory=str(directory), model=model, cfg=cfg, fmt=fmt, lam=lam, lam_source=source,
                        lam_details=details, src=src, X_in=X_in, columns=columns, held_out=held)


def polish_sae(directory: str, data: Any, out: str | os.PathLike[str], settings: PolishSettings | None = None, *,
               log: Callable[[str], None] | None = None, resume: bool = False) -> dict[str, Any]:
    """``dictcheck polish``: polish the SAE folder ``directory`` on ``data`` (an (N, D) array, an ``.npy`` path or an
    activation store; one token per row) and write the polished SAE and ``polish.json`` to ``out`` (module
    docstring); return ``polish.json``'s contents. ``out`` is locked for the run; its checkpoints (``polish_work/``)
    let ``resume`` continue a run that was stopped (without ``resume`` a folder holding them is refused).
    ValueError (one line) for input it cannot polish, before any work."""
    s = settings or PolishSettings()
    check_writable(directory)
    out = Path(out)
    work = out / WORK_DIR
    if work.exists() and not resume:
        raise ValueError(f"{work} holds a previous run's checkpoints; pass resume (--resume) to continue it, or "
                              "choose another output folder")
    with folder_lock(out, "dictcheck polish"):
        t0 = time.perf_counter()
        inp = read_polish_inputs(directory, data, s, log)
        t_read = time.perf_counter() - t0
        block, fit = polish_report(inp, max_sweeps=s.sweeps, tol=s.tol, device=s.device, log=log, work=work,
                                   checkpoint_every=s.checkpoint_every)
        t_polish = time.perf_counter() - t0 - t_read
        report = write_polished(out, inp, block, fit, s, log=log, resume=resume)
        report["timings_s"] = {"read_and_lam": round(t_read, 3), "polish": round(t_polish, 3),
                               "encoder_fit_and_write": round(time.perf_counter() - t0 - t_read - t_polish, 3)}
        atomic_write_bytes(out / POLISH_FILE, (json.dumps(_json_safe(report), indent=1) + "\n").encode())
    return report
