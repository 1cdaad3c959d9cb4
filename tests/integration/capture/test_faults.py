"""Faults on the thesis-scale path with a real (tiny) model (issue 23, item 13): two captures started into one
output never write it both, and a capture killed while its final file is written resumes to the uninterrupted
result. The bad-input refusals are in tests/unit/pipeline/test_faults.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

from tests.helpers import ROOT



# --------------------------------------------------------------------------- two writers, kills at the end

_CAPTURE = textwrap.dedent(
    """
    import os, sys, time
    import qkplast.capture.driver as driver
    from qkplast.options import CaptureOptions

    pause = float(sys.argv[3])
    original = driver.save_capture
    def save_then_pause(*args, **kwargs):  # the final file written, the parts not yet removed
        original(*args, **kwargs)
        print("final-written", flush=True)
        time.sleep(pause)
    driver.save_capture = save_then_pause
    part_pause = float(sys.argv[5])
    save_part = driver.PartStore.save
    def slow_part(self, *args):  # holds the output for a while, so a second writer meets it mid-capture
        save_part(self, *args)
        time.sleep(part_pause)
    driver.PartStore.save = slow_part
    options = CaptureOptions(model=sys.argv[1], corpus="pydoc-topics", short_docs="concat", seq_len=64, bucket_size=16,
                             samples_per_bucket=2, heads=5, docs=int(sys.argv[4]))
    try:
        driver.run_capture(options, sys.argv[2], progress=False)
    except Exception as exc:
        print(f"refused: {exc}", flush=True)
        sys.exit(3)
    print("done", flush=True)
    """
)


def _start(model_dir, out, pause=0.0, docs=12, part_pause=0.0):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", _CAPTURE, str(model_dir), str(out), str(pause), str(docs),
                             str(part_pause)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_HOLD = "import sys, time\nfrom pathlib import Path\nfrom qkplast.capture.resume import output_lock\n" \
        "with output_lock(Path(sys.argv[1])):\n    print('locked', flush=True)\n    time.sleep(600)\n"


def test_two_captures_into_one_output_never_write_it_both(model_dir, tmp_path):
    """A capture holds its output's lock from its first check to its last write; a second one started meanwhile
    (here against a process holding the lock the way a running capture does) is refused in one line and writes
    nothing; once the first is gone, the output is captured whole."""
    from qkplast.capture_format import open_capture, validate_capture

    out = tmp_path / "cap.nc"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        second = _start(model_dir, out, docs=4)
        second_out, second_err = second.communicate(timeout=600)
        assert second.returncode == 3 and "another capture is writing" in second_out, (second_out, second_err[-2000:])
        assert f"pid {holder.pid}" in second_out  # names who holds it
        assert not out.exists() and not (tmp_path / "cap.nc.parts").exists()
    finally:
        holder.kill()
        holder.wait()
    third = _start(model_dir, out, docs=4)  # the lock died with its holder: nothing stale to clear
    assert third.wait(timeout=600) == 0, third.stderr.read()[-2000:]
    assert validate_capture(open_capture(out)).attrs["n_docs"] == 4


def test_a_capture_killed_after_its_final_write_keeps_the_uninterrupted_result(model_dir, tmp_path):
    from qkplast.capture_format import open_capture
    from qkplast.options import CaptureOptions
    from qkplast.rundir.products import ensure_capture

    reference = tmp_path / "ref.nc"
    assert _start(model_dir, reference, docs=4).wait(timeout=300) == 0
    run = tmp_path / "run"
    run.mkdir()
    proc = _start(model_dir, run / "capture.nc", pause=30.0, docs=4)
    assert proc.stdout.readline().strip() == "final-written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (run / "capture.nc.parts").exists()  # killed before the parts were removed
    options = CaptureOptions(model=str(model_dir), corpus="pydoc-topics", short_docs="concat", seq_len=64,
                             bucket_size=16, samples_per_bucket=2, heads=5, docs=4)
    from qkplast.options import AnalysisOptions

    ensure_capture(run, options, AnalysisOptions())  # the resume `qkplast run` does: the written file is kept
    a, b = open_capture(run / "capture.nc"), open_capture(reference)
    for name in ("q", "k", "position", "doc"):
        np.testing.assert_array_equal(a[name].values, b[name].values)
    assert not (run / "capture.nc.parts").exists()  # and the leftover parts are cleared
