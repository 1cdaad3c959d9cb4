"""``-p NAME VALUE``: any capture option, analysis option or notebook parameter, typed from its definition.

A capture or analysis option is typed from its dataclass field (:func:`qkplast.options.typed_option`), a
notebook parameter from its default in the notebook's cell tagged ``parameters`` (``-p n_boot 100`` is an
int, ``-p checkpoints "['a@r']"`` a list). An unknown name or a value of the wrong type is a one-line error.
"""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

from qkplast.resources import resource_dir
from qkplast.options import AnalysisOptions, CaptureOptions, FieldSpec, UnknownOptionError, coerce, typed_option

__all__ = ["NOTEBOOK_DIR", "declared_parameters", "notebook_parameters", "notebook_paths", "parameters_cell",
           "parse_literal", "split_parameters"]

#: The book's notebooks: the checkout's ``notebooks/``, or the copy an installed wheel ships.
NOTEBOOK_DIR = resource_dir("notebooks")

CAPTURE_FIELDS = tuple(f.name for f in fields(CaptureOptions))
ANALYSIS_FIELDS = tuple(f.name for f in fields(AnalysisOptions))


def parse_literal(text: str):
    """A ``-p name value`` value: a Python literal (number, list, dict, quoted string) or a bare string."""
    low = text.lower()
    if low in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[low]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parameters_cell(source: str) -> dict:
    """Literal assignments of the cell tagged ``parameters`` in a py:percent notebook source."""
    match = re.search(r'# %% tags=\["parameters"\]\n(.*?)(?=\n# %%|\Z)', source, re.S)
    if not match:
        return {}
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(match.group(1)).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}


def declared_parameters(path: Path) -> dict:
    """The parameters one notebook declares (name -> default), from its ``.ipynb`` (what papermill runs)."""
    import nbformat

    nb = nbformat.read(path, 4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return parameters_cell('# %% tags=["parameters"]\n' + cells[0].source) if cells else {}


def notebook_paths(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The book's notebooks, ``NN_*.ipynb`` in order."""
    from qkplast.rundir.products import RunError

    paths = sorted(Path(directory).glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise RunError(f"no notebooks found in {directory}")
    return paths


def notebook_parameters(directory: Path = NOTEBOOK_DIR) -> dict:
    """Every parameter the notebooks declare (name -> default), from their ``.py`` sources (or ``.ipynb``)."""
    out = {}
    for path in notebook_paths(directory):
        py = path.with_suffix(".py")
        out.update(parameters_cell(py.read_text()) if py.exists() else declared_parameters(path))
    return out


def split_parameters(pairs, notebook_defaults: dict | None = None) -> tuple[dict, dict, dict]:
    """Sort ``-p NAME VALUE`` pairs into capture options, analysis options and notebook parameters, typed.

    ``seed`` is a capture option; the run's analysis uses it too.

    Raises
    ------
    QkplastError
        An unknown name (listing the valid ones) or a value of the wrong type.
    """
    notebook_defaults = notebook_parameters() if notebook_defaults is None else notebook_defaults
    capture, analysis, notebook = {}, {}, {}
    for name, text in pairs:
        if name in CAPTURE_FIELDS:
            capture[name] = typed_option(CaptureOptions, name, text)
        elif name in ANALYSIS_FIELDS:
            analysis[name] = typed_option(AnalysisOptions, name, text)
        elif name in notebook_defaults and name != "run_dir":
            default = notebook_defaults[name]
            # a string parameter takes its text as it is, or unquoted when it is a quoted literal ("smoke",
            # which is what json.dumps or a YAML study writes)
            quoted = isinstance(default, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'"
            value = parse_literal(text) if not isinstance(default, str) or quoted else text
            notebook[name] = value if default is None else coerce(value, FieldSpec((type(default),)), name)
        else:
            raise UnknownOptionError(
                f"unknown parameter {name!r}: not a capture option ({', '.join(CAPTURE_FIELDS)}), an analysis option "
                f"({', '.join(ANALYSIS_FIELDS)}) or a notebook parameter "
                f"({', '.join(sorted(set(notebook_defaults) - {'run_dir'}))})"
            )
    return capture, analysis, notebook
