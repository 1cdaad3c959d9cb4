"""``qkplast study STUDY.yaml [--executor local|slurm] [--stage capture|analyze|notebooks] [--status | --validate | --dry-run]``."""

from __future__ import annotations

import argparse

from qkplast.rundir.study_file import STAGES

__all__ = ["add_study_parser", "cmd_study"]


def cmd_study(args: argparse.Namespace) -> int:
    from qkplast.pipeline.study import format_status, status, submit
    from qkplast.rundir.study_file import load_study

    study = load_study(args.study)  # a bad file is a StudyError, reported in one line by qkplast.pipeline.cli.main
    if args.status:
        rows = status(study, args.stage)
        print(format_status(rows))
        return 0
    stage = args.stage or "notebooks"
    echo = lambda line: print(line, flush=True)  # noqa: E731
    if args.validate:
        from qkplast.pipeline.study import validate

        validate(study, echo=echo, executor=args.executor)
        print(f"study {study.name}: all {len(study.runs)} runs valid")
        return 0
    if args.dry_run:
        from qkplast.pipeline.study import dry_run

        dry_run(study, executor=args.executor, stage=stage, echo=echo)
        return 0
    print(f"study {study.name}: {len(study.runs)} runs under {study.out} (executor {args.executor}, stage {stage})")
    submitted = submit(study, executor=args.executor, stage=stage, echo=echo)
    if args.executor == "slurm":
        print(f"submitted {len(submitted)} job(s); follow them with: qkplast study {args.study} --status")
        return 0
    rows = status(study, stage)
    print(format_status(rows))
    return 0 if all(r["state"] == "done" for r in rows) else 1


def add_study_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``study`` to an argparse subparsers object; ``func`` is :func:`cmd_study`."""
    p = subparsers.add_parser("study", help="run a study (many models or settings) as submitit jobs, resumable per run")
    p.add_argument("study", help="study file (YAML, see studies/) or a study directory holding study.json")
    p.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="local: jobs on this machine, waited for; slurm: one array per resource set, submitted")
    p.add_argument("--stage", choices=STAGES, default=None,
                   help="stop each run after this stage (default: notebooks, everything qkplast run does)")
    p.add_argument("--status", action="store_true",
                   help="print one line per run (pending, running, done, failed with the reason and log) and exit")
    p.add_argument("--validate", action="store_true",
                   help="check every run without weights (model, tokenizer, corpus windows, memory plan), print the "
                   "commit each model name resolves to, and exit; submitting always validates first")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, then print what would be submitted (the generated sbatch script of each array for "
                   "--executor slurm) and submit nothing")
    p.set_defaults(func=cmd_study)
    return p
