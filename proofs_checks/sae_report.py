"""The report of ``dictcheck check-sae``: a trained SAE folder against the theory.

For any SAE folder in the SAELens layout (:func:`dictcheck.empirics.sae_folder.load_sae_model`):
* the narrow-dictionary diagnostics of its decoder W = W_decᵀ with exact codes at the SAE's own
  bias b_dec (docs/theory.md §3, §6; the same keys as ``check-dict``);
* the amortisation gap O(W, Z_encoder, b) − O(W, Z_exact, b) (docs/theory.md §6, §7), for SAEs with
  non-negative codes (not defined for the signed codes of ``abs``);
* per-latent firing fractions of the encoder, antipodal pairs (decoder cosine < −0.9) and dense
  latents (firing on more than half of the points);
* the reconstruction metrics of docs/ecosystem.md §2.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dictcheck.empirics.metrics import reconstruction_metrics, unit_atom_objective
from dictcheck.empirics.sae_folder import load_sae_model
from dictcheck.proofs_checks.dictionary_report import summary
from dictcheck.solvers.dictionary_check import check_dictionary

__all__ = ["ANTIPODAL_COSINE", "antipodal_pairs", "sae_report"]

ANTIPODAL_COSINE = -0.9


def antipodal_pairs(W_dec: np.ndarray, threshold: float = ANTIPODAL_COSINE) -> list[list[int]]:
    """Pairs [i, j], i < j, of decoder rows with cosine below ``threshold``."""
    norms = np.linalg.norm(W_dec, axis=1)
    unit = W_dec / np.where(norms > 0, norms, 1.0)[:, None]
    cos = unit @ unit.T
    i, j = np.nonzero(np.triu(cos < threshold, k=1))
    return [[int(a), int(b)] for a, b in zip(i, j)]


def sae_report(directory: str, X: np.ndarray, lam: float, *, progress: bool = False) -> dict[str, Any]:
    """Everything ``check-sae`` prints, for data X (N, D) with tokens as rows (see the module docstring).
    ValueError (one line; :class:`SaeFormatError` for the folder) for input it cannot check."""
    model, cfg = load_sae_model(directory)
    if X.shape[1] != cfg.d_in:
        raise ValueError(f"data have D = {X.shape[1]} columns but the SAE has d_in = {cfg.d_in}")
    weights = {k: v.detach().double().numpy() for k, v in model.state_weights().items()}
    W, b = weights["W_dec"].T, weights["b_dec"]
    if np.any(np.linalg.norm(W, axis=0) == 0):
        raise ValueError(f"{directory}: some decoder rows are zero; the dictionary cannot be normalised")
    with torch.no_grad():
        x = torch.as_tensor(X, dtype=cfg.torch_dtype)
        codes = model.encode(x)
        x_hat = model.decode(codes)
    codes_np = codes.double().numpy()
    check = check_dictionary(W, X.T, lam, b=b, progress=progress)
    report = summary(check)
    signed = bool(np.any(codes_np < 0))
    report["amortisation_gap"] = None if signed else (
        unit_atom_objective(W, codes_np.T, b, X.T, lam) - check.diagnostics.objective)
    firing = np.mean(codes_np != 0, axis=0)
    report.update(
        arch=model.arch, d_in=cfg.d_in, d_sae=cfg.d_sae, signed_codes=signed,
        encoder_firing_fraction=firing.tolist(),
        dense_latents=[int(d) for d in np.flatnonzero(firing > 0.5)],
        antipodal_pairs=antipodal_pairs(weights["W_dec"]),
        metrics=reconstruction_metrics(X, x_hat.double().numpy(), codes_np),
    )
    return report
