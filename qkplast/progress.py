"""Progress of long work: a tqdm bar on a terminal, one summary line anywhere else.

A tqdm bar redraws itself with carriage returns. A terminal shows that as one moving line; a notebook kernel
(and so every page of the book), a log file or a pipe keeps every redraw, and a few minutes of training became
hundreds of output blocks in a rendered page. :func:`progress_bar` is the one place that decides: on a
terminal it returns a tqdm bar, elsewhere a :class:`SummaryLine` that is silent while the work runs and writes
one line when it ends (or nothing, when there was nothing to do or the caller asked for no trace).

Every progress display of the package goes through :func:`progress_bar`, so that the policy holds everywhere.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable


def is_terminal(stream=None) -> bool:
    """Whether ``stream`` (default: the current ``sys.stderr``) is an interactive terminal.

    A notebook kernel's streams, files, pipes and pytest's captured streams are not; a closed or missing
    stream is not either.
    """
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file
        return False


def progress_bar(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "", unit: str = "it",
                 enabled: bool = True, leave: bool = True, initial: float = 0, unit_scale: bool = False,
                 stream=None, **bar_options):
    """A progress display for long work, chosen by where its output goes.

    Parameters
    ----------
    iterable : iterable, optional
        Wrapped and iterated (as ``tqdm(iterable)`` does); without it, call ``update(n)`` on the result.
    total : number, optional
        Expected amount of work (``len(iterable)`` when it has one).
    desc, unit : str
        What is counted: ``"train"`` and ``"tok"`` give ``train: 2.21M tok in 03:40 (10.0k tok/s)``.
    enabled : bool
        False: nothing is shown, on a terminal or not.
    leave : bool
        False: a nested display that leaves no trace when done (tqdm's ``leave``); off a terminal it prints
        nothing at all.
    initial : number
        Work already done before (a resumed run); not counted in the summary's amount or rate.
    unit_scale : bool
        Counts with SI prefixes (``2.21M``), in the bar and in the summary line.
    stream : file, optional
        Where the display goes; default the current ``sys.stderr``.
    **bar_options
        Passed to tqdm on a terminal only (``mininterval`` ...).

    Returns
    -------
    tqdm.tqdm or SummaryLine
        A context manager with ``update(n)``, ``close()`` and iteration over ``iterable``: a tqdm bar when
        ``stream`` is a terminal, else a :class:`SummaryLine`.
    """
    stream = sys.stderr if stream is None else stream
    if enabled and is_terminal(stream):
        from tqdm.std import tqdm  # the text bar: tqdm.auto would pick the notebook widget in a kernel

        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, initial=initial, unit_scale=unit_scale,
                    file=stream, **bar_options)
    return SummaryLine(iterable, total=total, desc=desc, unit=unit, initial=initial, unit_scale=unit_scale,
                       stream=stream if enabled and leave else None)


class SummaryLine:
    """A progress display that is silent while the work runs and writes one line when it is closed.

    ``train: 2.21M tok in 03:40 (10.0k tok/s)`` when the work finished; ``train: stopped at 1.10M of 2.21M
    tok after 01:50`` when it ended early (an error, an interrupt); nothing when no work was done (everything
    was reused) or ``stream`` is None. The same interface as the tqdm bar it stands for: a context manager,
    ``update(n)``, ``close()`` and iteration.
    """

    def __init__(self, iterable: Iterable | None = None, *, total: float | None = None, desc: str = "",
                 unit: str = "it", initial: float = 0, unit_scale: bool = False, stream=None, clock=time.perf_counter):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.initial = self.n = initial
        self.unit_scale, self.stream, self.clock = unit_scale, stream, clock
        self.start, self.closed = clock(), False

    def update(self, n: float = 1) -> None:
        """Count ``n`` more units of work done."""
        self.n += n

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.n += 1
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Write the summary line (once)."""
        if self.closed:
            return
        self.closed = True
        line = self.summary()
        if line is not None and self.stream is not None:
            print(line, file=self.stream, flush=True)

    def summary(self) -> str | None:
        """The line :meth:`close` writes, or None when no work was done."""
        from tqdm.std import tqdm

        done = self.n - self.initial
        if done <= 0:
            return None
        elapsed = self.clock() - self.start
        count = self._amount
        label = f"{self.desc}: " if self.desc else ""
        if self.total is not None and self.n < self.total:
            return f"{label}stopped at {count(self.n)} of {count(self.total)} {self.unit} after " \
                   f"{tqdm.format_interval(elapsed)}"
        rate = f" ({count(done / elapsed)} {self.unit}/s)" if elapsed > 0 else ""
        return f"{label}{count(self.n)} {self.unit} in {tqdm.format_interval(elapsed)}{rate}"

    def _amount(self, value: float) -> str:
        from tqdm.std import tqdm

        if self.unit_scale:
            return tqdm.format_sizeof(value)
        if value == int(value):
            return f"{int(value)}"
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
