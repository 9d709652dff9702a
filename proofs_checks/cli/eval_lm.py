"""``dictcheck eval-lm``: splice a saved SAE into a language model and report the LM metrics.

    dictcheck eval-lm DIR_SAE --layer L [--model smollm2|tinycoder|PATH] [--tokens T] [--context C]
                      [--batch-size B] [--seed S] [--names N] [--json]

Metrics (docs/vasae.md §5, docs/ecosystem.md §2; :mod:`empirics.metrics.lm`): ``ve``, ``fvu``,
``mse_per_element``, ``l0``, ``dead_frac`` on the layer's activations; ``ce_clean``, ``ce_sae``,
``ce_zero``, ``ce_recovered`` (zero ablation), ``ce_recovered_batch_mean``, ``delta_ce``, ``kl``,
``kl_score``; and, for SAEs with a decoder ``W_dec``, the vocabulary alignment against the model's
input embedding (``alignment_rate_all``, ``alignment_rate_alive``, ``coverage``, …) with the
intrinsic token names (top-5 tokens) of the ``N`` best-aligned alive features.

Evaluation text: the token windows of :mod:`empirics.data.activation_store` (``C`` tokens each, BOS
first when the tokenizer prepends one) covering ``T`` spliced positions, in the document order of
seed ``S`` (default 1; extraction defaults to seed 0, so the windows mostly differ from the
training tokens, but the corpus is shared: not a strict held-out split). Position 0 of each window
is never spliced and is left out of the reconstruction metrics, as activation stores drop it; the
CE and KL positions are all next-token positions of the windows.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from typing import TYPE_CHECKING

import numpy as np

from dictcheck.empirics.io.safe_files import check_memory
from dictcheck.proofs_checks.cli.inputs import finite_result
from dictcheck.proofs_checks.errors import UserError

if TYPE_CHECKING:
    from dictcheck.empirics.data.lm_models import LMShape
    from dictcheck.empirics.io.saelens import SaeConfig

_SHOWN = ("ve", "fvu", "mse_per_element", "l0", "dead_frac", "ce_clean", "ce_sae", "ce_zero", "ce_recovered",
          "delta_ce", "kl", "kl_score")
_ALIGN_SHOWN = ("alignment_rate_all", "alignment_rate_alive", "n_alive", "n_alive_aligned", "coverage",
                "coverage_alive", "s_mean", "s_median")


def _positive(name: str, value: int, low: int = 1) -> None:
    if value < low:
        raise UserError(f"{name} must be >= {low}, got {value}")


def _check_request(shape: LMShape, cfg: SaeConfig, sae_dir: str, layer: int, tokens: int, context: int,
                   batch_size: int) -> None:
    """What can be checked from the model's config before its weights load: the layer, the context
    (at most the model's positions), the SAE's width, and the memory of one spliced forward pass
    (the LM with its logits, plus the SAE's codes and reconstruction) with the evaluated rows kept
    for the metrics (x and x̂ in float64, and their concatenation)."""
    shape.check_layer(layer)
    shape.check_context(context)
    if cfg.d_in != shape.d_model:
        raise ValueError(f"{sae_dir} has d_in={cfg.d_in} but {shape.name}'s residual width is {shape.d_model}")
    sae_bytes = 2 * batch_size * context * (cfg.d_sae + cfg.d_in) * 4
    kept_rows = 4 * tokens * cfg.d_in * 8
    check_memory(shape.forward_bytes(batch_size, context, logits=True) + sae_bytes + kept_rows,
                 f"eval-lm on {shape.name} (--tokens {tokens}, --batch-size {batch_size} x --context {context})")


def evaluate(sae_dir: str, layer: int, model: str = "smollm2", tokens: int = 2048, context: int = 128,
             batch_size: int = 4, seed: int = 1, names: int = 10) -> dict[str, Any]:
    """The eval-lm report as a JSON-ready dict (UserError for bad input, found before the model's
    weights load where the config suffices)."""
    import torch

    from dictcheck.empirics.data.activation_store import token_windows
    from dictcheck.empirics.data.lm_models import load_lm
    from dictcheck.empirics.io.formats import load_any_sae
    from dictcheck.empirics.io.saelens import SaeFormatError
    from dictcheck.empirics.metrics.lm import alignment_metrics, feature_names, splice_metrics

    _positive("--tokens", tokens)
    _positive("--context", context, 2)
    _positive("--batch-size", batch_size)
    _positive("--names", names, 0)
    _positive("--seed", seed, 0)
    try:
        sae, cfg, _ = load_any_sae(sae_dir)
    except (SaeFormatError, ValueError, OSError) as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    try:
        lm = load_lm(model, check=lambda shape: _check_request(shape, cfg, sae_dir, layer, tokens, context,
                                                                   batch_size))
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    hook = cfg.dictcheck.get("hook")
    if isinstance(hook, dict) and hook.get("module") not in (None, lm.hook_spec(layer)["module"]):
        raise UserError(f"{sae_dir} was trained at hook {hook['module']!r}, not {lm.hook_spec(layer)['module']!r} (--layer {layer})")
    try:
        windows = token_windows(lm, math.ceil(tokens / (context - 1)), context=context, seed=seed)
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    ids = torch.from_numpy(windows)
    batches = [(ids[i:i + batch_size], torch.ones_like(ids[i:i + batch_size]))
               for i in range(0, ids.shape[0], batch_size)]
    with torch.no_grad():
        m = splice_metrics(lm, sae, layer, batches, skip_first=True)
    alive = m.pop("alive")
    report: dict[str, Any] = {"sae": str(sae_dir), "arch": sae.arch, "d_sae": cfg.d_sae, "model": model,
                              "layer": layer, "hook": lm.hook_spec(layer), "context": context, "seed": seed,
                              "n_windows": int(ids.shape[0]), "metrics": m, "alignment": None, "names": []}
    weights = sae.state_weights()
    if "W_dec" in weights and tuple(weights["W_dec"].shape) == (cfg.d_sae, cfg.d_in):
        E = lm.embedding()
        a = alignment_metrics(weights["W_dec"], E, alive)
        s = a.pop("s")
        a.pop("t")
        report["alignment"] = a
        order = [int(d) for d in np.argsort(-s, kind="stable") if alive[d]][:names]
        report["names"] = feature_names(weights["W_dec"], E, lm, order)
    return report


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def run_eval_lm(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck eval-lm``."""
    report = finite_result(evaluate(args.sae_dir, args.layer, args.model, args.tokens, args.context, args.batch_size,
                                    args.seed, args.names), "eval-lm")
    if args.json:
        print(json.dumps(report))
        return 0
    m = report["metrics"]
    print(f"{report['arch']} (d_sae {report['d_sae']}) spliced into {report['model']} at {report['hook']['module']}: "
          f"{m['n_eval_tokens']} tokens, {m['n_ce_tokens']} CE positions")
    print("  " + "  ".join(f"{k} {_fmt(m[k])}" for k in _SHOWN))
    a = report["alignment"]
    if a is not None:
        print("  " + "  ".join(f"{k} {_fmt(a[k])}" for k in _ALIGN_SHOWN))
        print("  buckets " + " ".join(f"{k} {v}" for k, v in a["buckets"].items()))
    for n in report["names"]:
        print(f"  feature {n['feature']}: " + ", ".join(f"{t!r} {c:.3f}" for t, c in zip(n["tokens"], n["cos"])))
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck eval-lm``."""
    p = commands.add_parser("eval-lm", help="splice a saved SAE into a language model: VE, CE recovered, KL, alignment")
    p.add_argument("sae_dir", metavar="DIR_SAE", help="a saved SAE folder (cfg.json + sae_weights.safetensors)")
    p.add_argument("--layer", required=True, type=int, help="decoder layer whose output the SAE reconstructs")
    p.add_argument("--model", default="smollm2", help="smollm2, tinycoder, or a local HF model dir / .gguf file")
    p.add_argument("--tokens", type=int, default=2048, help="evaluation tokens (default 2048)")
    p.add_argument("--context", type=int, default=128, help="window length in tokens, BOS included (default 128)")
    p.add_argument("--batch-size", type=int, default=4, help="windows per forward pass (default 4)")
    p.add_argument("--seed", type=int, default=1, help="document order of the evaluation text (default 1)")
    p.add_argument("--names", type=int, default=10, help="best-aligned alive features to name (default 10)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run_eval_lm)
