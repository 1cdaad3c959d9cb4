"""The default run as ``scripts/book.sh`` makes it, made once per test run and read by the tests of the book.

``bash scripts/book.sh`` builds the book from ``qkplast run --out runs/smollm2-135m --jobs 2`` (every capture,
analysis and notebook of the default run, two kernels at once), then folds papermill's injected cell into each
notebook's parameters cell. :func:`book_run` runs that same command here, once per test run: under ``pytest -n``
a file lock makes the other worker wait for it and read what it made, and after ``book.sh`` in the same clone the
command finds every capture, analysis and notebook done and executes nothing again (``qkplast run`` reuses a
notebook executed with the same source, parameters and qkplast code). The notebooks' regression
(``tests/book_regression.py``) compares each executed chapter with the committed one, and
``tests/acceptance/test_book.py`` builds the book from them exactly as ``book.sh`` does.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The default run's directory, as scripts/book.sh names it.
RUN_DIR = ROOT / "runs" / "smollm2-135m"
#: book.sh's step 2, the arguments of ``qkplast``.
COMMAND = ("run", "--out", "runs/smollm2-135m", "--jobs", "2")


@dataclass(frozen=True)
class BookRun:
    """What :func:`book_run` made: the run directory, its manifest, ``qkplast run``'s exit status, its output (the
    last lines), and its seconds here (0 when another process of this test run made it)."""

    run_dir: Path
    manifest: dict
    returncode: int
    output: str
    seconds: float

    def notebook(self, name: str) -> dict | None:
        """The manifest's entry of notebook ``name`` (``07_corrections.ipynb``), or None when it was not executed."""
        return next((e for e in self.manifest.get("notebooks", []) if e.get("name") == name), None)


_made: BookRun | None = None


def book_env() -> dict:
    """book.sh's environment for ``qkplast run``."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1"}


def book_run() -> BookRun:
    """``qkplast run --out runs/smollm2-135m --jobs 2`` from the checkout, once per test run (see the module doc)."""
    global _made
    if _made is not None:
        return _made
    RUN_DIR.parent.mkdir(exist_ok=True)
    qkplast = Path(sys.executable).with_name("qkplast")
    with open(RUN_DIR.parent / ".smollm2-135m.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while one makes the run
        t0 = time.perf_counter()
        done = subprocess.run([str(qkplast), *COMMAND], cwd=ROOT, env=book_env(), capture_output=True, text=True,
                              timeout=3600)
        seconds = time.perf_counter() - t0
    manifest_path = RUN_DIR / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    _made = BookRun(RUN_DIR, manifest, done.returncode, (done.stdout + done.stderr)[-6000:], seconds)
    return _made
