"""``qkplast train [STUDY.yaml] --out DIR [--preset default|smoke] [--FIELD VALUE ...]`` (issue 24).

One flag per field of :class:`qkplast.train.TrainConfig` (``ext_steps`` -> ``--ext-steps``), typed and documented
from the dataclass; a study file's ``train:`` mapping names the same fields, the flags given apply last. Every
problem with the input is one line and exit 2 (the catch site of :mod:`qkplast.pipeline.cli`) before anything
trains.
"""

from __future__ import annotations

import argparse

from qkplast.pipeline.flags import add_option_flags, given_options
from qkplast.train.config import PRESETS, TrainConfig, TrainConfigError, config_from, load_train_study

__all__ = ["add_train_flags", "add_train_parser", "cmd_train", "train_config"]


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`TrainConfig` field (:mod:`qkplast.pipeline.flags`); only the flags given reach the
    namespace (the study file and the preset fill the rest)."""
    add_option_flags(parser, TrainConfig, defaults=PRESETS["default"],
                     title="training settings (see qkplast.train.TrainConfig; defaults: --preset default)")


def train_config(args: argparse.Namespace):
    """The config and output directory of a ``qkplast train`` command line (study file, preset, then flags)."""
    flags = given_options(TrainConfig, args)
    out = args.out
    if args.study:
        study = load_train_study(args.study, overrides=flags, preset=args.preset)
        config, out = study.config, out or study.out
    else:
        config = config_from(args.preset or "default", flags)
    if out is None:
        raise TrainConfigError("no output directory: pass --out DIR (or name 'out:' in the study file)")
    return config, out


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from qkplast.capture.corpus import open_corpus
    from qkplast.train.run import train

    from qkplast.train.config import corpus_parts

    config, out = train_config(args)
    for part in corpus_parts(config.corpus):
        open_corpus(part)  # a missing corpus is a one-line error before anything is written
    training = train(config, Path(out), progress=not args.no_progress)
    for run in training["runs"]:
        print(f"seed {run['seed']} {run['arm']:<15} theta {run['rope_theta']:>8g}  final loss "
              f"{run['steps'][-1]['loss']:.3f}  ({len(run['branches'])} checkpoints)  {_speed(run)}")
    where = training.get("device", "cpu") + (f" ({training['gpu']})" if training.get("gpu") else "")
    print(f"trained {len(training['runs'])} runs on {where} into {out} (checkpoints: HF_HOME={Path(out) / 'hf'}, "
          f"branches of qkplast/miniature-seed{{S}})")
    return 0


def _speed(run: dict) -> str:
    """``12.3k tok/s, 41.0 s`` of a run's record (a record made before they were recorded: ``-``)."""
    rate, wall = run.get("tokens_per_s"), run.get("wall_s")
    if not rate:
        return "- tok/s"
    return f"{rate / 1e3:.1f}k tok/s, {wall:.1f} s"


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``train`` to an argparse subparsers object; ``func`` is :func:`cmd_train`."""
    p = subparsers.add_parser("train", help="train the miniature Llama (stage A and its extension arms), resumably",
                              description="Train a small Llama through pre-training and a long-context extension "
                              "in arms (issue 24); checkpoints are branches of DIR/hf (HF_HOME), a rerun resumes.")
    p.add_argument("study", nargs="?", default=None, help="training study file (YAML with a 'train:' mapping, see "
                   "studies/miniature.yaml)")
    p.add_argument("--out", default=None, help="training directory (default: the study file's 'out')")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="named settings the study and the flags modify (default: the study's, else 'default')")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_train_flags(p)
    p.set_defaults(func=cmd_train)
    return p
