"""The one-command GPU check (benchmarks/bench_gpu.py) on this machine: what it carries to the GPU, its wall-time
estimate, and its CPU rehearsal of the README's thesis-scale command through every stage."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.helpers import ROOT


def test_the_cpu_rehearsal_runs_the_readme_command_through_every_stage(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--selftest-cpu", "--work",
                        str(tmp_path), "--budget-s", "3600"], env=env, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "exit status 0" in out and "notebooks: 13 of 13 passed" in out
    ratio = float(re.search(r"capture / bare = ([0-9.]+)", out).group(1))
    assert 0.5 < ratio < 3  # the capture costs about the bare forward it replaces (both stop at its last layer)
    assert re.search(r"seconds per window \(main capture, 2 windows of 16384 tokens\): [0-9.]+", out)
    assert re.search(r"analyze of the run on the CPU: [0-9.]+ s", out) and "budget:" in out
    print(out[out.index("seconds per window"):])
