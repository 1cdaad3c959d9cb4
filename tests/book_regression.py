"""The notebooks' regression: each committed chapter against the book's own execution of it, by nbval's rules.

``pytest notebooks`` (what ``scripts/test.sh`` passes) collects every code cell of ``notebooks/NN_*.ipynb`` as one
item, as nbval does (``notebooks/07_corrections.ipynb::Cell 4``), but does not execute the notebook again: it reads
the cell's outputs from the default run as ``scripts/book.sh`` executes it (:func:`tests.book_run.book_run`,
``qkplast run --out runs/smollm2-135m --jobs 2``, made once per test run) and compares them with the committed
outputs through nbval's own comparison (:meth:`nbval.plugin.IPyNbCell.compare_outputs`: ``--nbval-sanitize-with``'s
patterns, the ``nbval-ignore-output`` and ``nbval-skip`` tags, images not compared). So each chapter is executed
once per test run, and what is compared is what the book shows.

A cell whose execution raised fails with the traceback, a notebook the run did not reach fails each of its cells
naming the notebook that stopped the run, and a run that failed before the notebooks fails them all with its
output. ``pytest --nbval notebooks/NN.ipynb`` still runs nbval itself (a kernel of its own, the notebook's default
parameters), as it did before.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from nbval.plugin import IPyNbCell, IPyNbFile, coalesce_streams

from tests.book_run import book_run

#: The committed chapters this regression collects (the same names as the book's notebooks).
PATTERN = re.compile(r"^\d\d_.*\.ipynb$")


def wanted(file_path, config) -> bool:
    """Whether this regression collects ``file_path``: a chapter notebook, with nbval itself not asked for."""
    return (PATTERN.match(file_path.name) is not None and file_path.parent.name == "notebooks"
            and not (config.option.nbval or config.option.nbval_lax))


class BookNotebook(IPyNbFile):
    """A committed chapter whose cells are compared with the book run's execution of it (no kernel here)."""

    def get_sanitize_files(self):
        """``--nbval-sanitize-with``'s file, by default the notebooks' own ``sanitize.cfg``."""
        return super().get_sanitize_files() or [str(self.path.parent / "sanitize.cfg")]

    def setup(self):
        self.setup_sanitize_files()
        self.made = book_run()
        entry = self.made.notebook(self.fspath.basename)
        path = self.made.run_dir / "notebooks" / self.fspath.basename
        self.problem = None
        if entry is None or not path.exists():
            stopped = [e for e in self.made.manifest.get("notebooks", []) if e.get("status") != "ok"]
            self.problem = (f"the book run did not execute {self.fspath.basename} (qkplast run exited "
                            f"{self.made.returncode}; " + (f"it stopped at {stopped[0]['name']}, cell {stopped[0].get('cell')}: "
                                                           f"{stopped[0].get('error')}" if stopped else
                                                           f"its output:\n{self.made.output}") + ")")
            self.executed = []
            return
        cells = [c for c in nbformat.read(path, as_version=4).cells
                 if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])]
        self.executed = cells

    def collect(self):
        for item in super().collect():  # nbval's cells, with their tags and comment markers read the same way
            yield BookCell.from_parent(self, name=item.name, cell_num=item.cell_num, cell=item.cell,
                                       options=item.options)

    def teardown(self):  # no kernel was started
        pass


class BookCell(IPyNbCell):
    """One code cell: its committed outputs against the book run's, through nbval's comparison."""

    def repr_failure(self, excinfo):
        # nbval's heading says the cell was executed here; it was read from the book's run
        return super().repr_failure(excinfo).replace("Notebook cell execution failed",
                                                     "The book run's cell fails the committed notebook's")

    def runtest(self):
        if self.options["skip"]:
            pytest.skip()
        parent = self.parent
        if parent.problem:
            self.raise_cell_error(parent.problem)
        if len(parent.executed) != len([c for c in parent.nb.cells if c.cell_type == "code"]):
            self.raise_cell_error("the executed notebook has another number of code cells than the committed one: "
                                  "its source changed after it was executed (rerun qkplast run)")
        executed = parent.executed[self.cell_num]
        if executed.source != self.cell.source:
            self.raise_cell_error("the executed cell's source differs from the committed cell's: the notebook "
                                  "changed after the run executed it")
        errors = [o for o in executed.outputs if o.output_type == "error"]
        if errors and not self.options["check_exception"]:
            self.raise_cell_error("Cell execution caused an exception", "\n" + "\n".join(errors[0].traceback))
        if self.cell.execution_count is None and self.cell.outputs:
            self.raise_cell_error("Unrun reference cell has outputs")
        if self.options["check"] and self.cell.execution_count is not None:
            if not self.compare_outputs(coalesce_streams(list(executed.outputs)), coalesce_streams(self.cell.outputs)):
                self.raise_cell_error("Cell outputs differ", "\n".join(self.comparison_traceback))


def collect_file(file_path, parent):
    """The :class:`BookNotebook` of a chapter, its cells as :class:`BookCell` items."""
    return BookNotebook.from_parent(parent, path=file_path)
