"""The progress policy (qkplast.progress): tqdm bars on a terminal, one summary line anywhere else."""

from __future__ import annotations

import ast
import io
import sys

import pytest

from qkplast.progress import SummaryLine, is_terminal, progress_bar
from tests.helpers import ROOT


class Terminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    """A clock that advances ``step`` seconds at each reading."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_off_a_terminal_the_work_writes_one_line_at_the_end():
    stream = io.StringIO()
    with progress_bar(total=300, desc="capture", unit="doc", stream=stream) as bar:
        assert isinstance(bar, SummaryLine)
        for _ in range(300):
            bar.update(1)
        assert stream.getvalue() == ""  # silent while the work runs
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "\r" not in stream.getvalue()
    assert lines[0].startswith("capture: 300 doc in ")


def test_the_default_stream_is_the_current_stderr(monkeypatch):
    """A notebook kernel replaces sys.stderr with a stream that is not a terminal: no bar there."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    assert list(progress_bar(range(4), desc="bootstrap")) == [0, 1, 2, 3]
    assert stream.getvalue().startswith("bootstrap: 4 it in ") and stream.getvalue().count("\n") == 1


def test_on_a_terminal_it_is_a_tqdm_bar():
    from tqdm.std import tqdm

    stream = Terminal()
    with progress_bar(total=3, desc="train", unit="tok", stream=stream, mininterval=0) as bar:
        assert isinstance(bar, tqdm)
        bar.update(3)
    assert "\r" in stream.getvalue() and "100%" in stream.getvalue()


@pytest.mark.parametrize("stream", [io.StringIO(), Terminal()], ids=["file", "terminal"])
def test_disabled_shows_nothing_anywhere(stream):
    with progress_bar(total=5, desc="x", enabled=False, stream=stream) as bar:
        bar.update(5)
    assert stream.getvalue() == ""


def test_a_nested_display_that_leaves_no_trace_prints_nothing_off_a_terminal():
    stream = io.StringIO()
    with progress_bar(total=30, desc="layers", leave=False, stream=stream) as bar:
        bar.update(30)
    assert stream.getvalue() == ""


def test_no_work_done_no_line():
    """A resumed run whose work was all done before (``initial == total``) says nothing."""
    stream = io.StringIO()
    with progress_bar(total=10, initial=10, desc="train", stream=stream):
        pass
    assert stream.getvalue() == ""


def test_the_summary_counts_scaled_units_and_the_rate():
    line = SummaryLine(total=2_210_000, desc="train", unit="tok", unit_scale=True, clock=Clock(110.5))
    line.update(2_210_000)
    assert line.summary() == "train: 2.21M tok in 01:50 (20.0k tok/s)"
    resumed = SummaryLine(total=10, initial=4, desc="checkpoints", clock=Clock(3.0))
    resumed.update(6)
    assert resumed.summary() == "checkpoints: 10 it in 00:03 (2 it/s)"  # the rate of this process's work only


def test_work_that_ends_early_says_where_it_stopped():
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with progress_bar(total=5, desc="conditions", stream=stream) as bar:
            bar.update(2)
            raise KeyboardInterrupt
    assert stream.getvalue().startswith("conditions: stopped at 2 of 5 it after ")


def test_close_writes_once():
    stream = io.StringIO()
    bar = progress_bar(total=1, desc="x", stream=stream)
    bar.update(1)
    bar.close()
    bar.close()
    assert stream.getvalue().count("\n") == 1


def test_is_terminal_of_streams_that_cannot_say():
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)
    assert not is_terminal(object())
    assert is_terminal(Terminal())


def test_every_progress_display_of_the_package_goes_through_the_policy():
    """No module but qkplast/progress.py imports tqdm: a direct bar would print its redraws into notebooks."""
    direct = []
    for path in sorted((ROOT / "qkplast").rglob("*.py")):
        if path == ROOT / "qkplast" / "progress.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            direct += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "tqdm"]
    assert direct == [], f"import qkplast.progress.progress_bar instead of tqdm at {direct}"
