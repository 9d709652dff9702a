"""VASAE on real activations (docs/vasae.md §2, §4, §5, §8; issue 7 item 5).

The data and the training helper are :mod:`dictcheck.proofs_checks.real_protocol` (SmolLM2 layer 10,
held-out evaluation rows, cached extraction). Three models, all with d_z = :data:`~dictcheck.proofs_checks.real_protocol.D_SAE`
(far below the paper's d_z = n_vocab = 49152, to fit 2 CPU cores), k = :data:`K`, Adam at the
authors' lr 1e-3 with the loop's warm-up/decay schedule and gradient clipping:

* ``plain``: λ_anchor = 0 (docs/vasae.md §4: the plain SAE is VASAE with λ_anchor = 0);
* ``anchored``: λ_anchor = :data:`ANCHOR_COEF` (the paper's main value) in nearest mode with
  anchor_every = :data:`ANCHOR_EVERY` (the authors' Llama setting, chosen for cost: one anchor
  evaluation is 2·d_z·V·D ≈ 29 GFLOP here; docs/vasae.md §3);
* ``hard``: the hard-tied baseline on the :data:`~dictcheck.proofs_checks.real_protocol.D_SAE` most frequent training tokens (the
  spec's labelled extension ``vocab_subset="top_frequency"``, option ``vocab_ids``), since
  d_z < n_vocab.

Metrics on the held-out rows: ``ve`` (docs/ecosystem.md §2) and the alignment of docs/vasae.md §5 against
SmolLM2's frozen input embedding (all features and alive features separately).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.lm_metrics import alignment_metrics
from dictcheck.empirics.metrics import fvu
from dictcheck.empirics.training import TrainResult
from dictcheck.proofs_checks.real_protocol import BATCH, D_SAE, LAYER, STEPS, real_data, train_real
from dictcheck.proofs_checks.registry import CheckContext, Outcome, check
from dictcheck.proofs_checks.sources import VASAE_PAPER

K = 32
LR = 1e-3
ANCHOR_COEF = 1e-4
ANCHOR_EVERY = 25
PARITY_TOL = 0.01
HARD_MARGIN = 0.1


def _options(kind: str) -> dict[str, Any]:
    data = real_data()
    if kind == "plain":
        return {}
    if kind == "anchored":
        return {"anchor_coef": ANCHOR_COEF, "anchor_every": ANCHOR_EVERY, "anchor_mode": "nearest",
                "anchor_source": data.embedding_path}
    top = np.argsort(-data.token_counts, kind="stable")[:D_SAE]
    return {"tie": "hard", "anchor_source": data.embedding_path, "vocab_ids": [int(v) for v in top]}


@functools.lru_cache(maxsize=None)
def _evaluated(ctx: CheckContext, kind: str) -> dict[str, Any]:
    """Train (or reuse) one model and evaluate it on the held-out rows."""
    result: TrainResult = train_real(ctx.out_dir, ctx.seed, f"vasae-{kind}", "vasae", {"k": K, **_options(kind)}, lr=LR,
                                     b_dec_init="zero")
    data = real_data()
    model = result.model
    with torch.no_grad():
        out = model(torch.from_numpy(data.X_eval))
    x_hat, codes = out.x_hat.double().numpy(), out.codes.numpy()
    alive = (codes != 0).any(axis=0)
    align = alignment_metrics(result.weights["W_dec"], np.load(data.embedding_path), alive)
    s = align.pop("s")
    align.pop("t")
    return {"ve": 1.0 - fvu(data.X_eval, x_hat), "l0": float(np.mean(np.sum(codes != 0, axis=1))),
            "dead_frac": float(1.0 - alive.mean()), "alignment": align,
            "s_mean_alive": float(s[alive].mean()) if alive.any() else None,
            "s_mean_dead": float(s[~alive].mean()) if (~alive).any() else None,
            "final_loss": result.final_loss, "out_dir": str(result.out_dir)}


def _anchor_steps() -> int:
    """Optimiser steps t < STEPS with t mod anchor_every = 0: the steps that carry the anchor term."""
    return len(range(0, STEPS, ANCHOR_EVERY))


def _training() -> dict[str, Any]:
    return {"d_sae": D_SAE, "k": K, "steps": STEPS, "batch_size": BATCH, "lr": LR, "layer": LAYER,
            "anchor_coef": ANCHOR_COEF, "anchor_every": ANCHOR_EVERY, "anchor_steps": _anchor_steps(),
            "data": real_data().describe()}


@check(
    "vasae.recon_parity",
    "VASAE reconstructs as well as the plain TopK SAE at the same k",
    "docs/vasae.md §4, §7 (VE flat in λ_anchor); issue 7",
    predicted=f"SmolLM2 layer {LAYER}, d_z = {D_SAE}, k = {K}: |VE(VASAE λ_anchor = {ANCHOR_COEF:g}) − VE(plain)| ≤ "
    f"{PARITY_TOL} on held-out tokens.",
    quick=False,
    kind="replication",
    source=f"{VASAE_PAPER}: anchoring costs no reconstruction",
    regime="SmolLM2-135M layer-5 activations (cached), TopK SAEs at our CPU width and budget (not the authors' "
    "d_z = vocabulary; issue 16)",
)
def vasae_recon_parity(ctx: CheckContext) -> Outcome:
    plain, anchored = _evaluated(ctx, "plain"), _evaluated(ctx, "anchored")
    diff = anchored["ve"] - plain["ve"]
    passed = abs(diff) <= PARITY_TOL
    return Outcome(
        measured={"ve_plain": plain["ve"], "ve_vasae": anchored["ve"], "ve_difference": diff},
        tolerance=PARITY_TOL, tolerance_reason="The issue's bar: VE within 0.01 of the plain SAE's.",
        passed=passed,
        finding=None if passed else f"VE differs by {diff:+.4f} (plain {plain['ve']:.4f}, VASAE {anchored['ve']:.4f}).",
        details={"plain": plain, "vasae": anchored, "training": _training()},
    )


@check(
    "vasae.hard_tied_worse",
    "The hard-tied baseline (decoder = W_E, frozen) reconstructs clearly worse",
    "docs/vasae.md §4; issue 7",
    predicted=f"VE(hard-tied, decoder = the {D_SAE} most frequent tokens' embeddings) ≤ VE(plain) − {HARD_MARGIN} on "
    "held-out tokens.",
    quick=False,
    kind="replication",
    source=f"{VASAE_PAPER}: a decoder tied to the embeddings reconstructs worse",
    regime="SmolLM2-135M layer-5 activations (cached), our CPU width and budget",
)
def vasae_hard_tied_worse(ctx: CheckContext) -> Outcome:
    plain, hard = _evaluated(ctx, "plain"), _evaluated(ctx, "hard")
    gap = plain["ve"] - hard["ve"]
    passed = gap >= HARD_MARGIN
    return Outcome(
        measured={"ve_plain": plain["ve"], "ve_hard_tied": hard["ve"], "ve_gap": gap},
        tolerance=HARD_MARGIN, tolerance_reason="The issue's bar: lower by at least 0.1.",
        passed=passed,
        finding=None if passed else f"the hard-tied VE is only {gap:.4f} below the plain SAE's.",
        details={"plain": plain, "hard_tied": hard, "training": _training(),
                 "vocab_policy": f"top_frequency: the {D_SAE} most frequent training tokens"},
    )


@check(
    "vasae.alignment",
    "Anchoring raises the alignment of ALIVE features (reported next to the all-feature rate)",
    "docs/vasae.md §5, §8; issue 7",
    predicted="alignment_rate_alive(VASAE) > alignment_rate_alive(plain) (s_d ≥ 0.8 against SmolLM2's input "
    "embedding, alive = fires on a held-out token); alignment_rate_all is reported for both.",
    quick=False,
    kind="replication",
    source=f"{VASAE_PAPER}: anchored features align with token embeddings",
    regime="SmolLM2-135M layer-5 activations (cached), our CPU width and budget (anchor schedule differs from "
    "the authors'; issue 16)",
)
def vasae_alignment(ctx: CheckContext) -> Outcome:
    plain, anchored = _evaluated(ctx, "plain"), _evaluated(ctx, "anchored")
    a_p, a_v = plain["alignment"], anchored["alignment"]
    rate_p, rate_v = a_p["alignment_rate_alive"], a_v["alignment_rate_alive"]
    passed = rate_p is not None and rate_v is not None and rate_v > rate_p
    keys = ("alignment_rate_all", "alignment_rate_alive", "n_alive", "n_alive_aligned", "coverage", "coverage_alive",
            "s_mean", "s_median", "buckets")
    return Outcome(
        measured={"plain": {k: a_p[k] for k in keys}, "vasae": {k: a_v[k] for k in keys},
                  "s_mean_alive": {"plain": plain["s_mean_alive"], "vasae": anchored["s_mean_alive"]},
                  "s_mean_dead": {"plain": plain["s_mean_dead"], "vasae": anchored["s_mean_dead"]}},
        tolerance="strictly greater", tolerance_reason="An ordering of two rates (the claim must hold on alive "
        "features, docs/vasae.md §8); no tolerance.",
        passed=passed,
        finding=None if passed else (
            f"alive-feature alignment is not raised: VASAE {rate_v} vs plain {rate_p} (all features: VASAE "
            f"{a_v['alignment_rate_all']:.4f}, plain {a_p['alignment_rate_all']:.4f}). The anchor acted on "
            f"{_anchor_steps()} of {STEPS} steps (anchor_every = {ANCHOR_EVERY}, for cost): the mean s of dead "
            f"columns moved {plain['s_mean_dead']:.3f} → {anchored['s_mean_dead']:.3f} and of alive columns "
            f"{plain['s_mean_alive']:.3f} → {anchored['s_mean_alive']:.3f}, so the anchor pulls dead columns first "
            "(docs/vasae.md §8), but this run is too short to say whether it would ever align alive ones."),
        details={"plain": plain, "vasae": anchored, "training": _training()},
    )
