"""``dictcheck polish DIR --data X --out OUT``: the SAE moved to the nearest stationary point of objective (1), with
an encoder fitted to it, written as a folder of the input's format (:func:`dictcheck.proofs_checks.sae_polish.polish_sae`).

``OUT`` is the polished SAE folder (SAELens loads it; ``dictcheck check-sae OUT`` re-checks it) with ``polish.json``
beside its files and the run's checkpoints in ``OUT/polish_work/`` (``--resume`` continues a stopped run);
``--json`` prints ``polish.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dictcheck.proofs_checks.cli.check_sae import _lam_arg
from dictcheck.proofs_checks.cli.inputs import output_dir, positive_lambda, scan_points_file
from dictcheck.proofs_checks.errors import UserError


def _print_human(r: dict[str, Any]) -> None:
    p, held, fit = r["polish"], r["held_out"], r["encoder_fit"]
    print(f"Polished {r['arch']} SAE {r['source']} ({r['d_sae']} latents, D = {r['d_in']}) at λ = {r['lam']:.6g} "
          f"({r['lam_source']}) on {p['n_tokens']} tokens; {held['n_tokens']} held out.")
    print(p["convergence"])
    print(f"objective (1), exact codes: {p['objective_before']:.6g} → {p['objective_after']:.6g} "
          f"({p['objective_change_pct']:+.2f}%) on the polishing tokens"
          + (f", {p['held_out']['objective_before']:.6g} → {p['held_out']['objective_after']:.6g} "
             f"({p['held_out']['objective_change_pct']:+.2f}%) held out" if p["held_out"] else ""))
    print(f"median atom cosine with its polished self {p['atom_cosine_quantiles']['0.5']:.3f} "
          f"(10% below {p['atom_cosine_quantiles']['0.1']:.3f}); {len(p['died'])} atoms died, {len(p['born'])} born")
    print(f"encoder fit: {fit['steps']} steps of {fit['batch_size']} tokens (decoder frozen; trained "
          f"{', '.join(fit['trained'])}), final loss {fit['final_loss']:.6g}")
    if "sae_before" in held:
        rows = [("SAE, its own encoder", held["sae_before"], held["sae_after"]),
                ("exact codes of the decoder", held["exact_codes_before"], held["exact_codes_after"])]
        print(f"held-out tokens ({held['n_tokens']}):      fvu before → after     L0 before → after")
        for name, a, b in rows:
            print(f"  {name:<28} {a['fvu']:.4f} → {b['fvu']:.4f}      {a['l0']:.2f} → {b['l0']:.2f}")
    print(f"wrote {r['output']} ({r['format']}), with polish.json")


def polish(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck polish``."""
    from dictcheck.empirics.io.saelens import SaeFormatError
    from dictcheck.proofs_checks.sae_polish import PolishSettings, check_writable, polish_sae

    for name in ("sweeps", "fit_steps", "fit_batch_size", "checkpoint_every"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.tokens is not None and args.tokens < 1:
        raise UserError(f"--tokens must be >= 1, got {args.tokens}")
    if not 0.0 <= args.holdout < 1.0:
        raise UserError(f"--holdout must be in [0, 1), got {args.holdout}")
    if args.fit_lr is not None and not 0 < args.fit_lr < float("inf"):
        raise UserError(f"--fit-lr must be a positive finite number, got {args.fit_lr}")
    if isinstance(args.lam, float):
        positive_lambda(args.lam)
    output_dir(args.out)
    try:
        check_writable(args.directory)
    except (SaeFormatError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    scan_points_file(args.data)
    settings = PolishSettings(lam=args.lam, holdout=args.holdout, tokens=args.tokens, sweeps=args.sweeps,
                              checkpoint_every=args.checkpoint_every, fit_steps=args.fit_steps,
                              fit_batch_size=args.fit_batch_size, fit_lr=args.fit_lr,
                              encoder_init=args.encoder_init, seed=args.seed,
                              device=args.device, progress=sys.stderr.isatty() and not args.json)
    quiet = args.json or sys.stderr.isatty()
    try:
        report = polish_sae(args.directory, args.data, args.out, settings, resume=args.resume,
                            log=None if quiet else lambda msg: print(f"[polish] {msg}", file=sys.stderr, flush=True))
    except (SaeFormatError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    if args.json:
        print(json.dumps(report))
    else:
        _print_human(report)
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck polish``."""
    p = commands.add_parser("polish", help="polish an SAE to the nearest stationary point of objective (1) and write "
                            "it, with an encoder fitted to it, as a folder of its own format")
    p.add_argument("directory", metavar="DIR", help="SAE folder (SAELens/dictcheck: cfg.json + sae_weights.safetensors)")
    p.add_argument("--data", required=True, metavar="X.npy|DIR", help="tokens (N, D), one per row: an .npy file or a "
                   "folder written by `dictcheck activations`")
    p.add_argument("--out", required=True, metavar="OUT", help="the polished SAE folder to write (with polish.json)")
    p.add_argument("--lam", type=_lam_arg, metavar="L|auto", help="λ of objective (1) (as check-sae: default the "
                   "folder's λ for L1 SAEs, else auto)")
    p.add_argument("--sweeps", type=int, default=300, metavar="S", help="sweep cap of polishing (default 300)")
    p.add_argument("--tokens", type=int, metavar="N", help="evenly spaced tokens polishing and the encoder fit use "
                   "(default: all not held out)")
    p.add_argument("--holdout", type=float, default=0.2, metavar="F", help="fraction of the tokens held out of "
                   "polishing and the fit, on which before and after are measured (default 0.2)")
    p.add_argument("--fit-steps", type=int, default=1000, metavar="N", help="steps of the encoder fit (default 1000)")
    p.add_argument("--fit-batch-size", type=int, default=1024, metavar="B", help="tokens per fit step (default 1024)")
    p.add_argument("--fit-lr", type=float, metavar="LR", help="learning rate of the fit (default: the architecture's)")
    p.add_argument("--encoder-init", choices=("tied", "sae"), default="tied", help="the fit's start: tied "
                   "(W_enc = W_decᵀ of the polished decoder, b_enc = 0; default) or the SAE's own encoder")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit's batches (default 0)")
    p.add_argument("--checkpoint-every", type=int, default=10, metavar="S", help="polishing sweeps between "
                   "checkpoints (default 10)")
    p.add_argument("--resume", action="store_true", help="continue a stopped run from OUT/polish_work/")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for the exact codes and the fit")
    p.add_argument("--json", action="store_true", help="print polish.json")
    p.set_defaults(handler=polish)
