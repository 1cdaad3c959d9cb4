"""Command line: ``qkplast prepare``, ``capture``, ``plan``, ``analyze``, ``run``, ``compare``, ``theory``.

Every field of :class:`qkplast.CaptureOptions` is a flag of ``capture``,
``plan`` and ``run`` (``--seq-len 8192``), every field of
:class:`qkplast.AnalysisOptions` a flag of ``analyze`` and ``run``
(``--covariance full``), with the same names and documented defaults.
Errors meant for the user (any :class:`qkplast.errors.QkplastError`, file
errors) are reported at one site, :func:`main`: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from qkplast.errors import QkplastError
from qkplast.options import AnalysisOptions
from qkplast.pipeline.cli_capture import add_capture_flags, add_capture_parser, add_plan_flags, add_plan_parser, add_prepare_parser
from qkplast.pipeline.cli_study import add_study_parser
from qkplast.pipeline.cli_train import add_train_parser
from qkplast.pipeline.flags import add_option_flags, given_options
from qkplast.rundir.study_file import STAGES


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors reach the one catch site in :func:`main` (one line, exit 2)."""

    def error(self, message):
        exc = _UsageError(f"{message} (see {self.prog} --help)")
        exc.prog = self.prog
        raise exc


class _UsageError(QkplastError):
    """A command line that does not parse; ``prog`` is the (sub)command it was meant for."""

    prog = "qkplast"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value}")
    return value


def add_analysis_flags(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """One flag per :class:`~qkplast.options.AnalysisOptions` field (``skip``: names the capture flags own)."""
    add_option_flags(parser, AnalysisOptions, title="analysis options (see qkplast.AnalysisOptions)", skip=skip)


def cmd_analyze(args: argparse.Namespace) -> int:
    from qkplast.analysis.metrics import analyze
    from qkplast.capture_format import open_capture, save_dataset

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    options = AnalysisOptions(**given_options(AnalysisOptions, args))  # bad option values before reading any file
    capture = open_capture(args.capture)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = analyze(capture, options)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    save_dataset(metrics, out, overwrite=args.overwrite)
    n = metrics.sizes["head"]
    print(f"analysed {n} heads of {capture.attrs['model']!r}: mean ap_overall {float(metrics.ap_overall.mean()):.4f}, "
          f"mean ap_drop {float(metrics.ap_drop.mean()):.4f}, mean bias_strength {float(metrics.bias_strength.mean()):.3g}")
    print(f"wrote {out}")
    return 0


def cmd_theory(args: argparse.Namespace) -> int:
    from qkplast.theory import checks as theory

    results = [theory.check_lemma_a1(seed=args.seed), theory.check_lemma_a2(seed=args.seed),
               theory.check_lemma_a2(route="sharp", seed=args.seed), theory.check_theorem_4_4(seed=args.seed)]
    for r in results:
        print(r)
    return 0 if all(r.passed for r in results) else 1


def _analysis_from_args(args: argparse.Namespace, capture_seed: int, overrides: dict) -> AnalysisOptions:
    """Analysis options of ``qkplast run``: its analysis flags, the seed of the capture, then ``-p`` overrides."""
    return AnalysisOptions(**{"seed": capture_seed, **given_options(AnalysisOptions, args), **overrides})


def cmd_run(args: argparse.Namespace) -> int:
    from qkplast.pipeline.cli_capture import capture_options
    from qkplast.pipeline.params import split_parameters
    from qkplast.pipeline.stages import run

    capture_overrides, analysis_overrides, notebook = split_parameters(args.parameter or [])
    capture = capture_options(args, **capture_overrides)
    analysis = _analysis_from_args(args, capture.seed, analysis_overrides)
    if args.dry_run:
        return _dry_run(capture, notebook, args.device_memory_gb)
    t0 = time.perf_counter()
    result = run(capture, args.out, analysis=analysis, parameters=notebook, stage=args.stage,
                 overwrite=args.overwrite, progress="lines" if args.progress_lines else not args.no_progress,
                 jobs=args.jobs, memory_check=not args.no_memory_check, device_memory_gb=args.device_memory_gb)
    m = result.manifest
    # the recorded timings add notebooks that ran side by side (--jobs) and work reused from earlier calls: the
    # wall time of this call is printed first
    work = sum(v for k, v in m["timings_s"].items() if ":" not in k)
    print(f"{args.stage} stage done for {capture.model!r} in {time.perf_counter() - t0:.0f} s "
          f"({len(m['notebooks'])} notebooks; {work:.0f} s of recorded work, each notebook counted whole); "
          f"outputs in {result.run_dir}")
    return 0


def _dry_run(capture, notebook: dict, device_memory_gb: float | None) -> int:
    """``qkplast run --dry-run``: the plan of the run's capture, then of the code capture beside it (notebook 09)."""
    from qkplast.capture.models import quiet_transformers
    from qkplast.capture.plan import plan_capture, size_code_capture
    from qkplast.pipeline.stages import CODE_CORPUS

    with quiet_transformers():
        plan = plan_capture(capture, device_memory_gb=device_memory_gb)
        print(plan)
        # the tokenizer the run's plan loaded sizes and plans the code capture too
        code = size_code_capture(plan.options, notebook.get("code_corpus", CODE_CORPUS), tokenizer=plan.tokenizer)
        print(f"\n{code.note}")
        if code.options is not None:
            code_plan = plan_capture(code.options, device_memory_gb=device_memory_gb, tokenizer=plan.tokenizer)
            problems = code_plan.problems()
            print(f"code capture: expected peak {code_plan.peak_gb:.2f} GiB; "
                  + ("fits" if not problems else "would be left out: " + "; ".join(problems))
                  + " (the code capture never stops the run)")
    plan.check()
    print("dry run: nothing captured")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from qkplast.results.summary import compare

    table = compare(args.runs)
    print(table.T.to_string(float_format=lambda v: f"{v:.4g}"))
    if args.out:
        table.to_csv(args.out)
        print(f"wrote {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="qkplast", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("analyze", help="PCA, rotation and plasticity metrics of a capture")
    p.add_argument("capture", help="capture file written by qkplast capture / qkplast.save_capture")
    p.add_argument("--out", required=True, help="metrics file to write (netCDF)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_analysis_flags(p)
    p.set_defaults(func=cmd_analyze)

    add_prepare_parser(sub)
    add_capture_parser(sub)
    add_study_parser(sub)
    add_train_parser(sub)

    add_plan_parser(sub)

    p = sub.add_parser("run", help="capture, analyse and execute every notebook for one model (papermill)",
                       description="One model load: the captures every notebook needs, then the analyses, then the "
                       "notebooks (papermill). A rerun reuses what is finished.")
    p.add_argument("--out", default=None, help="run directory (default: runs/MODEL)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"), default=[],
                   help="a capture option, analysis option or notebook parameter, typed from its definition, "
                   "e.g. -p docs 16 -p covariance full -p n_boot 100")
    p.add_argument("--stage", choices=STAGES, default="notebooks",
                   help="stop after this stage (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the capture plan (qkplast plan) and stop")
    add_plan_flags(p)
    p.add_argument("--overwrite", action="store_true", help="delete an existing run directory first")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.add_argument("--progress-lines", action="store_true",
                   help="progress as plain lines (window k of n, seconds per window, ETA) for log files, e.g. SLURM's")
    p.add_argument("--no-memory-check", action="store_true",
                   help="capture even when the plan's expected peak memory exceeds the device")
    p.add_argument("--jobs", type=_positive_int, default=1,
                   help="notebooks executed at once, each in its own kernel (default: %(default)s; the book build "
                   "uses 2 on CPU; keep 1 where a notebook would load a large model onto a GPU twice)")
    add_capture_flags(p)
    add_analysis_flags(p, skip=("seed", "device"))
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("compare", help="cross-model table of headline metrics from run directories")
    p.add_argument("runs", nargs="+", help="run directories made by qkplast run")
    p.add_argument("--out", default=None, help="CSV file to write")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("theory", help="numeric checks of Lemma A.1, Lemma A.2 and Theorem 4.4")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_theory)
    return parser


#: What the catch site reports in one line: qkplast's own errors, file errors and a missing optional package.
_USER_ERRORS = (QkplastError, OSError, ImportError)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``qkplast``: the one place that turns an error into one line on stderr and exit status 2."""
    command = "qkplast"
    try:
        args = build_parser().parse_args(argv)
        command = f"qkplast {args.command}"
        return args.func(args)
    except Exception as exc:
        if not isinstance(exc, _USER_ERRORS):
            raise
        command = getattr(exc, "prog", command)
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
