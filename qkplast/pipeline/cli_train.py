"""``qkplast train [STUDY.yaml] --out DIR [--preset default|smoke] [--FIELD VALUE ...]`` (issue 24).

One flag per field of :class:`qkplast.train.TrainConfig` (``ext_steps`` -> ``--ext-steps``), typed and documented
from the dataclass; a study file's ``train:`` mapping names the same fields, the flags given apply last. Every
problem with the input is one line and exit 2 (the catch site of :mod:`qkplast.pipeline.cli`) before anything
trains.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from qkplast.errors import QkplastError
from qkplast.pipeline.cli_capture import field_help
from qkplast.options import typed_option
from qkplast.train.config import PRESETS, TrainConfig, TrainConfigError, config_from, load_train_study

__all__ = ["add_train_flags", "add_train_parser", "cmd_train", "train_config"]


def _typed(name: str):
    def parse(text: str):
        value = [part.strip() for part in text.split(",") if part.strip()] if name == "arms" else text
        try:
            return typed_option(TrainConfig, name, value)
        except QkplastError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names the type in its message
    return parse


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`TrainConfig` field; only the flags given reach the namespace (the preset fills the rest).

    (The lead's shared flag builder for the options dataclasses replaces this function at merge.)
    """
    group = parser.add_argument_group("training settings (see qkplast.train.TrainConfig; defaults: --preset default)")
    helps, base = field_help(TrainConfig), PRESETS["default"]
    for f in fields(TrainConfig):
        default = getattr(base, f.name)
        shown = ",".join(default) if isinstance(default, tuple) else default
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=argparse.SUPPRESS,
                           type=_typed(f.name), help=f"{helps.get(f.name, '')} (default: {shown})")


def train_config(args: argparse.Namespace):
    """The config and output directory of a ``qkplast train`` command line (study file, preset, then flags)."""
    flags = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
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

    config, out = train_config(args)
    open_corpus(config.corpus)  # a missing corpus is a one-line error before anything is written
    training = train(config, Path(out), progress=not args.no_progress)
    for run in training["runs"]:
        print(f"seed {run['seed']} {run['arm']:<15} theta {run['rope_theta']:>8g}  final loss "
              f"{run['steps'][-1]['loss']:.3f}  ({len(run['branches'])} checkpoints)")
    print(f"trained {len(training['runs'])} runs into {out} (checkpoints: HF_HOME={Path(out) / 'hf'}, branches of "
          f"qkplast/miniature-seed{{S}})")
    return 0


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
