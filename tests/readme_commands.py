"""The README's documented commands as argument lists, for the tests and the GPU check that run them as written.

``readme_commands(section)`` reads the ``qkplast run`` commands of one README section's bash blocks
(continuations joined, comments dropped); ``substitute(argv, model=..., corpus=...)`` replaces the values of
the named flags and nothing else, failing when a flag is not in the command.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
#: The README section of the thesis-scale commands.
THESIS_SECTION = "### At the thesis's scale, on a GPU"


def readme_commands(section: str = THESIS_SECTION, program: str = "qkplast run", readme: Path = README) -> list[list[str]]:
    """The ``program`` commands of a README section, as the arguments of ``qkplast`` (the subcommand first)."""
    text = readme.read_text()
    body = text[text.index(section) + len(section):]
    body = re.split(r"\n#{1,3} ", body, maxsplit=1)[0]  # up to the next heading of any level
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", body, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:len(program.split())] == program.split():
                commands.append(words[1:])
    return commands


def substitute(argv: list[str], **values) -> list[str]:
    """``argv`` with the value of each ``--flag`` named in ``values`` (``seq_len=`` for ``--seq-len``) replaced."""
    out, seen = list(argv), set()
    for i, word in enumerate(out[:-1]):
        name = word.removeprefix("--").replace("-", "_")
        if word.startswith("--") and name in values:
            out[i + 1] = str(values[name])
            seen.add(name)
    missing = sorted(set(values) - seen)
    if missing:
        raise ValueError(f"the README command lacks {missing}: {argv}")
    return out
