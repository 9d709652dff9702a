"""Checks of the theory on SAEs trained on REAL language-model activations (issue 7 item 5).

Data (fixed once, Decision): SmolLM2-135M-Instruct (:func:`empirics.lm_models.load_lm`, "smollm2"),
the output of decoder layer :data:`LAYER`, :data:`N_TOKENS` rows from the shipped corpus
(:func:`empirics.activation_store.extract_activations`, context 128, seed 0). The last
:data:`N_HELDOUT` rows are held out for evaluation; the rest train. Extraction (about 2 minutes on
2 busy cores, plus the ~20–60 s model load) happens once into a cache keyed by these settings,
``<tempdir>/dictcheck-real/<key>/`` (activations, the frozen W_E as ``embedding.npy`` and the
training tokens' counts ``token_counts.npy``); later runs open it (shard SHA-256s verified) without
loading the model. Trained SAEs are written under the run's ``out_dir/real_models/`` and reused by
later checks of the same run (and by reruns into the same out_dir, via ``train(resume=True)``).

Widths are far below the paper's (d_z = n_vocab = 49152): every SAE here has :data:`D_SAE` latents,
so that each check fits in about 2–3 minutes on 2 CPU cores.

* ``real.antipodal_dense`` (theory.md §4.5, §5.1, §8 Q2): relu SAEs at λ, λ/4 and λ/16 (pooled) and
  an abs SAE at λ.
* ``real.stationarity`` (theory.md §6, §7, §8 Q3): the ``check-sae`` diagnostics of the relu SAE.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.activation_store import extract_activations, is_activation_dir, open_activations, token_windows
from dictcheck.empirics.atomic_files import atomic_write_bytes
from dictcheck.empirics.training import TrainConfig, TrainResult, torch_threads, train
from dictcheck.proofs_checks.cli.check_sae import ANTIPODAL_COSINE, antipodal_pairs, sae_report
from dictcheck.proofs_checks.registry import CheckContext, Outcome, check

MODEL = "smollm2"
LAYER = 10
N_TOKENS = 16384
N_HELDOUT = 2048
CONTEXT = 128
EXTRACT_SEED = 0
D_SAE = 512
STEPS = 600
BATCH = 256
#: λ of objective (1) for relu/abs, in units of the data (Decision, fixed before any run): the
#: standard deviation of a random unit projection of a centred token, median_t ‖x_t − x̄‖/√D.
LAM_UNITS = 1.0
#: real.antipodal_dense also trains relu SAEs at λ/4 and λ/16: dense latents (firing > 50%) exist only
#: at weak enough sparsity, and at λ itself none appeared (first run), so the claim could not be tested
#: there. The grid is fixed (factors of 4), and the verdict pools every λ of it.
RELU_LAM_FACTORS = (1.0, 0.25, 0.0625)
DENSE = 0.5
STATIONARITY_TOKENS = 128
GAP_TOL = -1e-9


@dataclass(frozen=True)
class RealData:
    """Cached real activations: training and held-out rows (float32, tokens as rows) and side files."""

    X_train: np.ndarray
    X_eval: np.ndarray
    embedding_path: str
    token_counts: np.ndarray
    manifest: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        return {"model": MODEL, "layer": LAYER, "hook": self.manifest.get("hook"), "n_train": len(self.X_train),
                "n_eval": len(self.X_eval), "context": CONTEXT, "seed": EXTRACT_SEED,
                "corpus": self.manifest.get("corpus"), "cache": str(Path(self.embedding_path).parent)}


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


@functools.lru_cache(maxsize=1)
def real_data() -> RealData:
    """Extract (first time) or open the cached activations; see the module docstring."""
    root = Path(tempfile.gettempdir()) / "dictcheck-real" / f"{MODEL}_L{LAYER}_T{N_TOKENS}_c{CONTEXT}_s{EXTRACT_SEED}"
    act, emb, counts = root / "activations", root / "embedding.npy", root / "token_counts.npy"
    if not (is_activation_dir(act) and emb.is_file() and counts.is_file()):
        from dictcheck.empirics.lm_models import load_lm

        lm = load_lm(MODEL)
        root.mkdir(parents=True, exist_ok=True)
        extract_activations(lm, LAYER, N_TOKENS, act, context=CONTEXT, seed=EXTRACT_SEED, progress=False)
        windows = token_windows(lm, math.ceil(N_TOKENS / (CONTEXT - 1)), context=CONTEXT, seed=EXTRACT_SEED)
        train_ids = windows[:, 1:].reshape(-1)[:N_TOKENS - N_HELDOUT]  # the rows' tokens (position 0 dropped)
        atomic_write_bytes(counts, _npy(np.bincount(train_ids, minlength=lm.vocab_size)))
        atomic_write_bytes(emb, _npy(lm.embedding().detach().cpu().numpy().astype(np.float32)))
    store = open_activations(act)
    X = store.to_array()
    return RealData(X_train=X[:-N_HELDOUT], X_eval=X[-N_HELDOUT:], embedding_path=str(emb),
                    token_counts=np.load(counts), manifest=store.manifest)


def train_real(ctx: CheckContext, name: str, **config: Any) -> TrainResult:
    """Train on the cached training rows into ``out_dir/real_models/<name>-<config hash>`` (resumable)."""
    data = real_data()
    settings = {"steps": STEPS, "batch_size": BATCH, "seed": ctx.seed, "device": "cpu", "dtype": "float32",
                "checkpoint_every": 0, "log_every": 100, "keep_checkpoints": 1, **config}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    with torch_threads(1):  # a shared 2-core machine: one intra-op thread per check
        return train(data.X_train, TrainConfig(**settings), ctx.out_dir / "real_models" / f"{name}-{key}",
                     resume=True, progress=False)


def real_lam(data: RealData) -> float:
    """λ = LAM_UNITS · median_t ‖x_t − x̄‖/√D on the training rows (see :data:`LAM_UNITS`)."""
    X = data.X_train.astype(np.float64)
    return float(LAM_UNITS * np.median(np.linalg.norm(X - X.mean(axis=0), axis=1)) / np.sqrt(X.shape[1]))


def _encode(result: TrainResult, X: np.ndarray) -> np.ndarray:
    model = result.model
    with torch.no_grad():
        return model.encode(torch.from_numpy(X).to(next(model.parameters()).dtype)).double().numpy()


def _antipode_table(result: TrainResult, X: np.ndarray) -> dict[str, Any]:
    Z = _encode(result, X)
    firing = np.mean(Z != 0, axis=0)
    pairs = antipodal_pairs(result.weights["W_dec"].double().numpy())
    has = np.zeros(Z.shape[1], dtype=bool)
    for i, j in pairs:
        has[i] = has[j] = True
    dense, alive = firing > DENSE, firing > 0
    other = alive & ~dense
    rate = lambda m: float(has[m].mean()) if m.any() else None  # noqa: E731
    return {"n_pairs": len(pairs), "pairs": pairs[:50], "n_dense": int(dense.sum()), "n_other_alive": int(other.sum()),
            "n_dense_with_antipode": int((has & dense).sum()), "n_other_with_antipode": int((has & other).sum()),
            "antipode_rate_dense": rate(dense), "antipode_rate_other": rate(other),
            "dense_firing": [round(float(f), 4) for f in firing[dense]], "l0": float(np.mean(np.sum(Z != 0, axis=1))),
            "dead": int((~alive).sum())}


@check(
    "real.antipodal_dense",
    "Real activations: dense latents of a relu SAE have decoder antipodes; an abs SAE has no antipodal pairs",
    "theory.md §4.5, §5.1, §8 Q2; issue 7",
    predicted=f"SmolLM2 layer {LAYER}, d_sae = {D_SAE}, λ = {LAM_UNITS}·median‖x − x̄‖/√D: in relu SAEs at λ·"
    f"{list(RELU_LAM_FACTORS)} (pooled), latents firing on > {DENSE:.0%} of held-out tokens have a decoder antipode "
    f"(cos < {ANTIPODAL_COSINE}) more often than the other alive latents; the abs SAE at λ (signed codes) has no "
    "antipodal pair.",
    quick=False,
)
def real_antipodal_dense(ctx: CheckContext) -> Outcome:
    data = real_data()
    lam = real_lam(data)
    tables = {f"relu λ·{f:g}": _antipode_table(train_real(ctx, "relu", arch="relu", d_sae=D_SAE, lam=lam * f),
                                              data.X_eval) for f in RELU_LAM_FACTORS}
    relu = {key: sum(t[key] for t in tables.values())
            for key in ("n_pairs", "n_dense", "n_dense_with_antipode", "n_other_alive", "n_other_with_antipode")}
    relu["antipode_rate_dense"] = relu["n_dense_with_antipode"] / relu["n_dense"] if relu["n_dense"] else None
    relu["antipode_rate_other"] = (relu["n_other_with_antipode"] / relu["n_other_alive"]
                                   if relu["n_other_alive"] else None)
    tables["abs"] = ab = _antipode_table(train_real(ctx, "abs", arch="abs", d_sae=D_SAE, lam=lam), data.X_eval)
    dense_rate, other_rate = relu["antipode_rate_dense"], relu["antipode_rate_other"]
    relu_ok = dense_rate is not None and other_rate is not None and dense_rate > other_rate
    passed = relu_ok and ab["n_pairs"] == 0
    finding = None
    if not passed:
        parts = []
        if relu["n_dense"] == 0:
            parts.append(f"no relu SAE (λ·{list(RELU_LAM_FACTORS)}) has a latent firing on > {DENSE:.0%} of tokens, "
                         "so the dense-latent claim could not be tested")
        elif not relu_ok:
            parts.append(f"relu (pooled over λ): {relu['n_dense_with_antipode']}/{relu['n_dense']} dense latents have "
                         f"an antipode vs {relu['n_other_with_antipode']}/{relu['n_other_alive']} other alive latents "
                         "(not higher)")
        if ab["n_pairs"]:
            parts.append(f"abs: {ab['n_pairs']} antipodal pairs (predicted 0)")
        finding = "; ".join(parts) + "."
    return Outcome(
        measured={"relu": {k: relu[k] for k in ("n_pairs", "n_dense", "n_dense_with_antipode", "n_other_alive",
                                               "n_other_with_antipode", "antipode_rate_dense", "antipode_rate_other")},
                  "relu_per_lam": {name: {k: t[k] for k in ("n_dense", "n_dense_with_antipode", "n_other_alive",
                                                            "n_other_with_antipode", "l0")}
                                   for name, t in tables.items() if name != "abs"},
                  "abs_pairs": ab["n_pairs"]},
        tolerance={"rate_dense_minus_other": "> 0", "abs_pairs": 0},
        tolerance_reason="Counts, no tolerance: the issue's prediction is an ordering of two rates and a zero count.",
        passed=passed, finding=finding,
        details={"tables": tables, "lam": lam, "relu_lam_factors": list(RELU_LAM_FACTORS), "data": data.describe(),
                 "training": {"d_sae": D_SAE, "steps": STEPS, "batch_size": BATCH, "lr": "arch default"}},
    )


@check(
    "real.stationarity",
    "Real activations: check-sae diagnostics of a relu SAE (amortisation gap, atoms failing each condition)",
    "theory.md §6, §7, §8 Q3; issue 7",
    predicted=f"relu SAE of real.antipodal_dense at its own λ, exact codes on {STATIONARITY_TOKENS} held-out tokens: "
    f"amortisation gap O(W, Z_encoder, b) − O(W, Z_exact, b) ≥ {GAP_TOL:g}; the share of atoms failing S1, the hull "
    "identity (5) and the bias identity (4) is reported (descriptive: §8 Q3 is open).",
    quick=False,
)
def real_stationarity(ctx: CheckContext) -> Outcome:
    data = real_data()
    lam = real_lam(data)
    result = train_real(ctx, "relu", arch="relu", d_sae=D_SAE, lam=lam)
    X = data.X_eval[:STATIONARITY_TOKENS].astype(np.float64)
    report = sae_report(str(result.out_dir), X, lam)
    tol = report["tolerances"]
    live = [a for a in report["atoms"] if not a["dead"]]

    def share(key: str, bound: float) -> float | None:
        vals = [a[key] for a in live if a[key] is not None]
        return float(np.mean([v > bound for v in vals])) if vals else None

    bias_fail = [abs(a["bias_off_mean"] - a["bias_target"]) > tol["bias"] for a in live
                 if a["bias_off_mean"] is not None and a["bias_target"] is not None]
    shares = {"S1_stationarity": share("stationarity", tol["stationarity"]), "hull_(5)": share("hull", tol["hull"]),
              "bias_identity_(4)": float(np.mean(bias_fail)) if bias_fail else None}
    medians = {key: float(np.median(vals)) if (vals := [a[key] for a in live if a[key] is not None]) else None
               for key in ("stationarity", "hull")}
    gap = report["amortisation_gap"]
    passed = gap is not None and gap >= GAP_TOL
    measured = {"amortisation_gap": gap, "relative_gap": gap / (report["objective"] + gap) if gap is not None else None,
                "n_live_atoms": len(live), "n_dead_atoms": len(report["dead_atoms"]), "failing_share": shares,
                "median_atom_violation": medians,
                "stationary": report["stationary"], "failed_conditions": report["failed_conditions"]}
    return Outcome(
        measured=measured, tolerance=GAP_TOL,
        tolerance_reason="Exact codes minimise (1) for fixed (W, b), so the gap is ≥ 0 up to the lasso solver's "
        "tolerance; the failing shares use check-sae's own per-condition tolerances (listed in details).",
        passed=passed,
        finding=None if passed else f"amortisation gap {gap} below {GAP_TOL:g} (the exact codes were worse).",
        details={"tolerances": tol, "max_violations": {k: report[k] for k in (
                     "kkt_violation", "stationarity_violation", "hull_violation", "bias_identity_violation")},
                 "objective_exact": report["objective"], "best_new_atom_gain": report["best_new_atom_gain"],
                 "wide_gap": report["wide_gap"], "metrics": report["metrics"], "lam": lam,
                 "atoms_firing_over_half": report["atoms_firing_over_half"], "data": data.describe()},
    )
