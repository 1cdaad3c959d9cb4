"""Assembling the book: the executed notebooks of a run or a study, with papermill's injected cell folded.

``scripts/book.sh`` builds the HTML from ``book/notebooks/``; this module fills that folder: the notebooks
of the default run (:func:`fold_injected_parameters` on each copy) or, for a study, every notebook executed
on the study's first run with ``study`` set (:func:`book_notebooks`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from qkplast.pipeline.study import execute_run
from qkplast.rundir.study_file import Study, load_study

__all__ = ["book_notebooks", "fold_injected_parameters"]


def fold_injected_parameters(path: str | os.PathLike) -> bool:
    """Fold papermill's injected-parameters cell into the tagged parameters cell and drop it.

    Each assignment of the injected cell replaces the line assigning the same name in the parameters
    cell (its comment kept), so a reader sees one parameters cell holding the run's values; names the
    parameters cell does not declare are appended. A path inside the checkout (``qkplast run`` passes the run
    directory absolute) is shown relative to the notebooks' folder, as the defaults are written, so no page
    shows where this machine keeps the checkout. Returns whether the notebook changed.
    """
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    injected = [i for i, c in enumerate(nb.cells) if "injected-parameters" in c.metadata.get("tags", [])]
    params = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    if not injected or not params:
        return False
    values = {name: _shown(value) for name, value in _assignments(nb.cells[injected[0]].source).items()}
    lines = nb.cells[params[0]].source.splitlines()
    seen = set()
    for i, line in enumerate(lines):
        m = re.match(r"^([A-Za-z_]\w*)\s*=\s*(.*?)(\s+#.*)?$", line)
        if m and m.group(1) in values:
            lines[i] = f"{m.group(1)} = {values[m.group(1)]}{m.group(3) or ''}"
            seen.add(m.group(1))
    lines += [f"{k} = {v}" for k, v in values.items() if k not in seen]
    nb.cells[params[0]].source = "\n".join(lines)
    del nb.cells[injected[0]]
    nbformat.write(nb, path)
    return True


def _assignments(source: str) -> dict[str, str]:
    """``name = expression`` lines of papermill's injected cell, as source text."""
    out = {}
    for line in source.splitlines():
        m = re.match(r"^([A-Za-z_]\w*)\s*=\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).rstrip()
    return out


def _shown(value: str) -> str:
    """An injected value as the book shows it: a string literal naming an absolute path inside the checkout
    becomes that path relative to the notebooks' folder (``"../runs/smollm2-135m"``); anything else as it is."""
    import ast

    from qkplast.pipeline.params import NOTEBOOK_DIR

    try:
        text = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value
    if not isinstance(text, str) or not os.path.isabs(text):
        return value
    checkout = NOTEBOOK_DIR.parent
    if not Path(text).resolve().is_relative_to(checkout.resolve()):
        return value
    return json.dumps(os.path.relpath(Path(text).resolve(), NOTEBOOK_DIR.resolve()))


def book_notebooks(study: str | os.PathLike | Study, target: str | os.PathLike) -> list[Path]:
    """Execute every notebook for the study's first run with ``study`` set, into ``target``, folded.

    The first run of the study is the book's reference run (its pages show that run in detail); the
    results chapters' study cells read every run. Runs must have been analysed (``qkplast study
    STUDY --stage analyze``).
    """
    study = study if isinstance(study, Study) else load_study(study)
    first = study.runs[0]
    target = Path(target)
    execute_run(first, "notebooks", parameters={"study": str(study.out)})
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for nb in sorted((first.run_dir / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        paths.append(target / nb.name)
        paths[-1].write_bytes(nb.read_bytes())
        fold_injected_parameters(paths[-1])
    return paths
