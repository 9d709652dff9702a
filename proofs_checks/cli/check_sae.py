"""``dictcheck check-sae DIR --data X.npy|STORE [--lam L|auto] [--polish] [--hull] [--json]``: a trained SAE
against the theory (:func:`dictcheck.proofs_checks.sae_report.sae_report`), as a readable report or JSON.

The human report opens with the verdict paragraph, then explains the scale of each violation, then lists
the numbers; ``--json`` prints the whole report (keys: those of ``check-dict`` plus ``lam``, ``lam_source``,
``l0_sae``, ``l0_exact``, ``amortisation_gap``, ``metrics``, ``polish`` with ``--polish``, ``timings_s``,
``verdict``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from dictcheck.proofs_checks.cli.check_dict import print_human as print_dictionary_report
from dictcheck.proofs_checks.cli.inputs import CODES_TOL_RANGE, finite_result, scan_points_file
from dictcheck.proofs_checks.cli.ranks import (
    failed_rank_line,
    launch_ranks,
    record_worker_crash,
    report_worker_error,
    user_error_line,
)
from dictcheck.proofs_checks.errors import UserError
from dictcheck.solvers.devices import DEVICE_CHOICES

#: What each violation measures, for readers of the report (docs/theory.md §6).
SCALES = (
    "How to read the violations (all scale-free; 0 at a stationary point, tolerance 1e-6):",
    "  KKT-z     max |ŵ_dᵀr_i/λ − 1| on active codes and (ŵ_dᵀr_i/λ − 1)₊ off them: 0.05 means a residual "
    "correlates 5% of λ beyond what an optimum allows.",
    "  S1        max ‖ŵ_d − Σ_i π_di r_i/λ‖: the distance between a unit atom and the activation-weighted mean of "
    "its residuals in units of λ (at an optimum that mean is the atom itself); 1 is as far as a unit vector from "
    "its orthogonal complement, and values above 2 mean the residuals an atom fires on are many λ long.",
    "  hull (5)  max over atoms of the largest gap between its cosine vector and the weighted mean of its points' "
    "φ_i (same units as KKT).",
    "  antipode gain, new-atom gain: how much (1) would drop (mean per token) by adding −ŵ_d, or the best atom found.",
)


def _lam_arg(value: str) -> float | str:
    if value == "auto":
        return value
    try:
        lam = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number or 'auto', got {value!r}") from None
    if not (lam > 0 and lam < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive finite number or 'auto', got {value!r}")
    return lam


def _print_human(report: dict[str, Any], directory: str) -> None:
    from dictcheck.solvers.decoder_geometry import ANTIPODAL_COSINE

    print(report["verdict"])
    print()
    print("\n".join(SCALES))
    print()
    trained = report.get("training_architecture")
    arch = report["arch"] + (f" (trained as {trained})" if trained and trained != report["arch"] else "")
    print(f"SAE {directory} ({report['format']}): arch {arch}, d_in {report['d_in']}, "
          f"d_sae {report['d_sae']}, {report['n_tokens']} tokens from {report['data']}")
    print(f"λ = {report['lam']:.6g} ({report['lam_source']}"
          + (f"; {report['lam_details']['note']}" if report["lam_details"].get("note") else "") + ")")
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"mean L0: SAE {report['l0_sae']:.2f}, exact codes {report['l0_exact']:.2f}")
    gap = report["amortisation_gap"]
    print(f"amortisation gap: {'n/a (signed codes)' if gap is None else f'{gap:.4e}'}")
    metrics = report["metrics"]
    if "metrics_error" in metrics:
        print(f"reconstruction metrics: {metrics['metrics_error']}")
    else:
        print(f"reconstruction: fvu {metrics['fvu']:.4f}  ve {metrics['ve']:.4f}  l0 {metrics['l0']:.2f}  "
              f"dead_frac {metrics['dead_frac']:.3f}")
    print(f"encoder latents firing on > 1/2 of tokens: {report['dense_latents'][:20] or 'none'}"
          + (f" (+{len(report['dense_latents']) - 20} more)" if len(report["dense_latents"]) > 20 else ""))
    pairs = report["antipodal_pairs"]
    print(f"antipodal pairs (decoder cosine < {ANTIPODAL_COSINE}): {pairs[:20] or 'none'}"
          + (f" (+{len(pairs) - 20} more)" if len(pairs) > 20 else ""))
    polish = report.get("polish")
    if polish:
        print(f"polish ({polish['n_tokens']} tokens, {polish['sweeps']} sweeps, "
              f"{'converged' if polish['converged'] else 'stopped at the sweep cap'}): objective "
              f"{polish['objective_before']:.6g} → {polish['objective_after']:.6g} "
              f"({polish['objective_change_pct']:+.3f}%), stationary: {polish['stationary']}; "
              f"{len(polish['died'])} atoms died, {len(polish['born'])} were born; moved most: "
              + ", ".join(f"{m['atom']} (cos {m['cosine']:.3f})" for m in polish["moved_most"][:5]))
        held = polish["held_out"]
        if held:
            print(f"  on {held['n_tokens']} held-out tokens: objective {held['objective_before']:.6g} → "
                  f"{held['objective_after']:.6g} ({held['objective_change_pct']:+.3f}%)")
    print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in report["timings_s"].items()))
    print("\ndecoder with exact codes at b_dec:")
    print_dictionary_report(report)


def check_sae(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck check-sae``: here, as one rank under torchrun, or launching ``--nproc`` ranks."""
    from dictcheck.empirics.training.distributed import env_world_size

    if args.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {args.nproc}")
    try:
        world_size = env_world_size()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.nproc > 1:
        if world_size > 1:
            raise UserError("--nproc starts torchrun itself; under torchrun leave --nproc out")
        _validate(args)
        return launch_ranks("check-sae", args, _failure_line, positionals=("directory",))
    if world_size == 1:
        return _check_here(args, None)
    rank = int(os.environ.get("RANK", "0"))
    try:
        import torch.distributed as dist

        dist.init_process_group(backend="gloo")
        try:
            from dictcheck.proofs_checks.rank_reduction import RankReduction

            return _check_here(args, RankReduction())
        finally:
            dist.destroy_process_group()
    except UserError as exc:
        return report_worker_error(world_size, rank, str(exc))
    except Exception as exc:  # a crash, or a peer lost: the launcher reports it in one line
        return record_worker_crash(exc)


def _failure_line(rank: int, failure: Any) -> tuple[str, int]:
    """(one line, exit code) for the root failure of a launched check: its user error, or the rank that died."""
    user = user_error_line(rank, failure)
    return user if user is not None else (f"check-sae failed: {failed_rank_line(rank, failure, None)}", 1)


def _settings(args: argparse.Namespace) -> Any:
    """The check's settings from the options, every one checked by the rules the API applies
    (:class:`~dictcheck.proofs_checks.sae_report.SaeCheckSettings`; UserError, one line)."""
    from dictcheck.proofs_checks.sae_report import SaeCheckSettings

    try:
        return SaeCheckSettings(lam=args.lam, batch_size=args.batch_size, latent_block=args.latent_block,
                                hull=args.hull, hull_atoms=args.hull_atoms, hull_tokens=args.hull_tokens,
                                polish=args.polish, polish_tokens=args.polish_tokens, polish_iters=args.polish_iters,
                                polish_holdout=args.polish_holdout, tol=args.tol, device=args.device,
                                progress=sys.stderr.isatty() and not args.json)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _validate(args: argparse.Namespace) -> None:
    """The options and the data file, before any work (UserError, one line)."""
    _settings(args)
    scan_points_file(args.data)  # an .npy file: format, dtype, shape, finite, magnitude (stores check themselves)


def _check_here(args: argparse.Namespace, reduce: Any) -> int:
    """The check in this process (alone, or as one rank of ``reduce``'s group: rank 0 prints); the report's
    modules load here, not when the parser is built."""
    from dictcheck.empirics.io.saelens import SaeFormatError
    from dictcheck.proofs_checks.sae_report import sae_report
    from dictcheck.solvers.reductions import LOCAL

    settings = _settings(args)
    scan_points_file(args.data)  # an .npy file: format, dtype, shape, finite, magnitude (stores check themselves)
    main = reduce is None or reduce.rank == 0
    quiet = args.json or sys.stderr.isatty() or not main
    try:
        report = sae_report(args.directory, args.data, settings,
                            log=None if quiet else lambda msg: print(f"[check-sae] {msg}", file=sys.stderr, flush=True),
                            reduce=LOCAL if reduce is None else reduce)
    except (SaeFormatError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    if not main:
        return 0
    finite_result(report, "check-sae", allow=("metrics.rel_recon_bias",))
    if args.json:
        print(json.dumps(report))
    else:
        _print_human(report, args.directory)
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck check-sae``."""
    p = commands.add_parser("check-sae", help="check a trained SAE (SAELens, sparsify or dictionary_learning folder) "
                            "against the theory")
    p.add_argument("directory", metavar="DIR", help="SAE folder: SAELens/dictcheck (cfg.json + "
                   "sae_weights.safetensors), sparsify (cfg.json + sae.safetensors) or dictionary_learning "
                   "(config.json + ae.pt)")
    p.add_argument("--data", required=True, metavar="X.npy|DIR", help="tokens (N, D), one per row: an .npy file "
                   "(memory-mapped) or a folder written by `dictcheck activations`")
    p.add_argument("--lam", type=_lam_arg, metavar="L|auto", help="λ of objective (1); 'auto': the λ at which exact "
                   "codes are as sparse as the SAE's; default: the folder's λ for L1 SAEs, else auto")
    p.add_argument("--polish", action="store_true", help="also polish the decoder to the nearest stationary point "
                   "and compare (each sweep solves exact codes on the polishing tokens)")
    p.add_argument("--polish-tokens", type=int, metavar="N", help="evenly spaced tokens polishing uses (default: all "
                   "not held out; use at least ~4 per atom)")
    p.add_argument("--polish-holdout", type=float, default=0.2, metavar="F", help="fraction of the tokens kept out of "
                   "polishing, on which the objective before and after is also reported (default 0.2; 0: none)")
    p.add_argument("--polish-iters", type=int, default=300, metavar="S", help="sweep cap of polishing (default 300)")
    p.add_argument("--hull", action="store_true", help="also the distances to the four hull candidates of "
                   "docs/theory.md §8 Q1 (one QP per atom) for the --hull-atoms atoms where (5) is violated most, "
                   "on --hull-tokens evenly spaced tokens")
    p.add_argument("--hull-atoms", type=int, default=32, metavar="A", help="atoms --hull measures (default 32)")
    p.add_argument("--hull-tokens", type=int, default=2048, metavar="N", help="tokens --hull uses (default 2048)")
    p.add_argument("--batch-size", type=int, metavar="B", help="tokens per batch of the streamed passes (default "
                   "4096; the encoder takes fewer at a time when d_sae is large)")
    p.add_argument("--latent-block", type=int, metavar="L", help="atoms per block of the screened products of tokens "
                   "with every atom (default: blocks of about 256 MiB)")
    p.add_argument("--tol", type=float, default=1e-8, help="relative KKT tolerance of the exact codes, in "
                   f"[{CODES_TOL_RANGE[0]:g}, {CODES_TOL_RANGE[1]:g}] (default 1e-8)")
    p.add_argument("--device", default="cpu", help=f"{DEVICE_CHOICES} (default cpu): where the screened products of "
                   "the exact codes and diagnostics run (the per-token solves run on the CPU)")
    p.add_argument("--nproc", type=int, default=1, metavar="P", help="split the tokens over P processes (gloo; "
                   "the report equals one process's); torchrun --nproc-per-node P -m dictcheck.proofs_checks.cli "
                   "check-sae ... works as well")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(handler=check_sae)
