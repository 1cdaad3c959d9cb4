"""Command-line flags generated from an options dataclass: one flag per field, typed from its annotation.

Both :class:`~qkplast.options.CaptureOptions` and :class:`~qkplast.options.AnalysisOptions` (and any other
options dataclass) get their flags here: ``seq_len`` becomes ``--seq-len``, a ``Literal`` field takes one of
its values, a ``tuple[int, ...]`` field comma-separated values (``--set-sizes 2,8``), a bool field a value or
none (``--allow-unverified`` is ``--allow-unverified true``), and the help is the first sentence of the field's
entry in the class docstring. A value that does not parse is a usage error naming the option.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import fields

from qkplast.errors import QkplastError
from qkplast.options import field_spec, typed_option

__all__ = ["add_option_flags", "field_help", "flag_name", "given_options"]


def flag_name(name: str) -> str:
    """The flag of a field: ``seq_len`` -> ``--seq-len``."""
    return "--" + name.replace("_", "-")


def field_help(cls) -> dict[str, str]:
    """First sentence of each field's entry in the numpydoc-style docstring of ``cls``."""
    out, lines = {}, (cls.__doc__ or "").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s{4}([a-z_, ]+) : ", line)
        if not m or i + 1 >= len(lines):
            continue
        text = []
        for follow in lines[i + 1:]:
            if not follow.startswith(" " * 8):
                break
            text.append(follow.strip())
        plain = re.sub(r":\w+:`~?([^`]+)`", r"\1", " ".join(text)).replace("``", "")
        sentence = re.split(r"(?<!e\.g)(?<!i\.e)\. ", plain)[0].rstrip(".")
        for name in m.group(1).split(","):
            out[name.strip()] = sentence.replace("%", "%%")
    return out


def _parser_of(cls, name: str):
    """An argparse ``type`` that converts text to the field's type, or fails naming the option."""
    def parse(text: str):
        try:
            return typed_option(cls, name, text)
        except QkplastError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names the type in its message
    return parse


def _shown(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return "all" if value is None else str(value)


def add_option_flags(parser: argparse.ArgumentParser, cls, *, title: str, skip: tuple[str, ...] = (),
                     defaults=None) -> None:
    """Add one flag per field of the options dataclass ``cls`` (but ``skip``) to a group named ``title``.

    No default is set on the parser (``argparse.SUPPRESS``): only the flags given reach the namespace, and
    :func:`given_options` reads them, so a preset or a recorded run is not masked by the dataclass defaults.
    ``defaults`` (an instance of ``cls``) is what the help shows as each flag's default.
    """
    group = parser.add_argument_group(title)
    helps, base = field_help(cls), defaults if defaults is not None else cls()
    for f in fields(cls):
        if f.name in skip:
            continue
        spec = field_spec(cls, f.name)
        kwargs = {"dest": f.name, "default": argparse.SUPPRESS, "type": _parser_of(cls, f.name),
                  "help": f"{helps.get(f.name, '')} (default: {_shown(getattr(base, f.name))})".strip()}
        if spec.choices is not None:  # argparse names the choices in its message
            kwargs.update(choices=spec.choices, type=str)
        if spec.kinds == (bool,):  # a bare --flag means true
            kwargs.update(nargs="?", const=True, metavar="true|false")
        group.add_argument(flag_name(f.name), **kwargs)


def given_options(cls, args: argparse.Namespace) -> dict:
    """The fields of ``cls`` whose flags were given on the command line, typed."""
    return {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
