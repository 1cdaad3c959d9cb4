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
from ._study_cli import add_study_parser
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


def cmd_run(args: argparse.Namespace) -> int:
    from .batch import RunError, _literal, run

    params = {name: _literal(value) for name, value in (args.parameter or [])}
    try:
        result = run(args.model, args.out, device=args.device, parameters=params, overwrite=args.overwrite,
                     progress=not args.no_progress)
    except RunError as exc:
        print(f"qkplast run: {exc}", file=sys.stderr)
        return 1
    m = result.manifest
    print(f"ran {len(m['notebooks'])} notebooks for {args.model!r} in {sum(m['timings_s'].values()):.0f} s; "
          f"outputs in {result.run_dir}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .batch import compare

    table = compare(args.runs)
    print(table.T.to_string(float_format=lambda v: f"{v:.4g}"))
    if args.out:
        table.to_csv(args.out)
        print(f"wrote {args.out}")
    return 0


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
    add_study_parser(sub)

    p = sub.add_parser("run", help="capture, analyse and execute every notebook for one model (papermill)")
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (embedded), a local directory or a hub id")
    p.add_argument("--out", default=None, help="run directory (default: runs/MODEL)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (bf16 on a GPU)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="notebook/capture/analysis parameter, e.g. -p docs 16 -p covariance full")
    p.add_argument("--overwrite", action="store_true", help="delete an existing run directory first")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("compare", help="cross-model table of headline metrics from run directories")
    p.add_argument("runs", nargs="+", help="run directories made by qkplast run")
    p.add_argument("--out", default=None, help="CSV file to write")
    p.set_defaults(func=cmd_compare)

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
