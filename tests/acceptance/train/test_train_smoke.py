"""The smoke training as a user runs it: ``qkplast train`` killed mid-run (the whole process group) and resumed to
identical weights, and ``qkplast capture`` reading a branch offline with ``HF_HOME``. The finished training is the
session's (``smoke_training`` in tests/conftest.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from qkplast.train import PRESETS, repo_id

from tests.helpers import ROOT, smoke_branch_names, smoke_refs

SMOKE = PRESETS["smoke"]
FINAL, MID = smoke_branch_names()


@pytest.fixture(scope="module")
def smoke(smoke_training):
    return smoke_training


def _env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
            "PYTHONPATH": str(ROOT)}


def test_a_killed_training_resumes_to_identical_weights(smoke, tmp_path):
    """qkplast train on two worker processes, killed (the whole process group) after a mid-stage resume state,
    then rerun: it resumes and every branch has the uninterrupted in-process training's commit."""
    import torch

    out, training = smoke
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "qkplast.pipeline.cli", "train", "--preset", "smoke", "--workers", "2",
           "--out", str(killed), "--no-progress"]
    child = subprocess.Popen(cmd, env=_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    state, deadline = killed / "state" / "seed0-stageA.pt", time.time() + 300
    while not (state.exists() and torch.load(state, weights_only=False)["step"] >= 20):
        assert child.poll() is None, child.stderr.read()[-2000:]
        assert time.time() < deadline, "no mid-stage resume state within 5 minutes"
        time.sleep(0.1)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert not (killed / "training.json").exists()
    resumed = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for seed in range(SMOKE.seeds):
        assert smoke_refs(killed, seed) == smoke_refs(out, seed)
    again = json.loads((killed / "training.json").read_text())
    assert [[s["loss"] for s in r["steps"]] for r in again["runs"]] == [[s["loss"] for s in r["steps"]]
                                                                         for r in training["runs"]]


def test_qkplast_capture_reads_a_branch_offline_with_hf_home(smoke, tmp_path):
    out, _ = smoke
    cap = tmp_path / "cap.nc"
    argv = [sys.executable, "-m", "qkplast.pipeline.cli", "capture", "--model", f"{repo_id(0)}@{MID}",
            "--corpus", str(out / "data" / "heldout.jsonl"), "--seq-len", "64", "--bucket-size", "8", "--docs", "2",
            "--heads", "all", "--samples-per-bucket", "4", "--device", "cpu", "--out", str(cap)]
    env = {**_env(), "HF_HOME": str(out / "hf")}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    from qkplast.capture_format import open_capture

    ds = open_capture(cap)
    assert (ds.attrs["model"], ds.attrs["revision"], ds.attrs["commit"]) == (
        repo_id(0), MID, smoke_refs(out, 0)[MID])
    assert ds.sizes["head"] == SMOKE.layers * SMOKE.heads
