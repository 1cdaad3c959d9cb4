"""Command line: ``qkplast prepare``, ``capture``, ``analyze``, ``theory``.

Every analysis option of :class:`qkplast.AnalysisOptions` is a flag
(``--covariance full``, ``--n-pairs 512``), with the same documented default.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import fields
from pathlib import Path

from ._capture_cli import add_capture_parser, add_prepare_parser
from .options import _CHOICES, AnalysisOptions


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per analysis option, typed from its default."""
    group = parser.add_argument_group("analysis options (see qkplast.AnalysisOptions)")
    for f in fields(AnalysisOptions):
        flag = "--" + f.name.replace("_", "-")
        kind = type(f.default)
        kwargs = {"dest": f.name, "default": f.default, "help": f"default: {f.default}"}
        if f.name in _CHOICES:
            kwargs["choices"] = _CHOICES[f.name]
        elif kind is bool:
            kwargs["type"] = _bool
        else:
            kwargs["type"] = kind
        group.add_argument(flag, **kwargs)


def options_from_args(args: argparse.Namespace) -> AnalysisOptions:
    return AnalysisOptions(**{f.name: getattr(args, f.name) for f in fields(AnalysisOptions)})


def cmd_analyze(args: argparse.Namespace) -> int:
    from .analyze import analyze
    from .io import open_capture, save_dataset

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    capture = open_capture(args.capture)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = analyze(capture, options_from_args(args))
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    save_dataset(metrics, out, overwrite=args.overwrite)
    n = metrics.sizes["head"]
    print(f"analysed {n} heads of {capture.attrs['model']!r}: mean ap_overall {float(metrics.ap_overall.mean()):.4f}, "
          f"mean ap_drop {float(metrics.ap_drop.mean()):.4f}, mean bias_strength {float(metrics.bias_strength.mean()):.3g}")
    print(f"wrote {out}")
    return 0


def cmd_theory(args: argparse.Namespace) -> int:
    from . import theory

    results = [theory.check_lemma_a1(seed=args.seed), theory.check_lemma_a2(seed=args.seed),
               theory.check_lemma_a2(route="sharp", seed=args.seed), theory.check_theorem_4_4(seed=args.seed)]
    for r in results:
        print(r)
    return 0 if all(r.passed for r in results) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qkplast", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("analyze", help="PCA, rotation and plasticity metrics of a capture")
    p.add_argument("capture", help="capture file written by qkplast capture / qkplast.save_capture")
    p.add_argument("--out", required=True, help="metrics file to write (netCDF)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_option_flags(p)
    p.set_defaults(func=cmd_analyze)

    add_prepare_parser(sub)
    add_capture_parser(sub)

    p = sub.add_parser("theory", help="numeric checks of Lemma A.1, Lemma A.2 and Theorem 4.4")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_theory)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileExistsError, FileNotFoundError, PermissionError, ValueError, TypeError) as exc:
        print(f"qkplast {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
