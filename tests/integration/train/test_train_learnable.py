"""A training with every issue-36 setting on (warmup-stable-decay, arms from the pre-decay checkpoint with its AdamW
state, copied spans, device auto) on a smoke-sized config: the records, the branching, kill and resume to the same
bits; and the CPU kernels that make the weights the same on any x86-64 CPU (issue 35), in force in the training
worker whatever the parent's environment."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from qkplast.train import PRESETS, TrainConfig, hub_cache, repo_id, train
from qkplast.train.hub import snapshot

from tests.helpers import ROOT, smoke_refs

#: Smoke-sized, one seed, two arms; the decay starts at step 30, where the arms branch.
TINY = TrainConfig.from_kwargs(
    PRESETS["smoke"], seeds=1, steps=40, warmup=4, schedule="wsd", decay_share=0.25, ext_from="predecay", ext_steps=8,
    ext_warmup=0, ext_lr=5e-3, copy_share=0.5, copy_len=8, arms=("rescaled", "control"), resume_every=5,
    device="auto")
PREDECAY = f"stageA-step{TINY.ext_start}"


def _env(**extra):
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
            "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("learnable") / "train"
    return out, train(TINY, out, progress=False)


def _weights(out, branch):
    return (snapshot(hub_cache(out), repo_id(0), branch) / "model.safetensors").read_bytes()


def test_records_carry_the_device_the_kernels_and_the_speed(tiny):
    import torch

    out, training = tiny
    device = "cuda" if torch.cuda.is_available() else "cpu"  # device auto
    assert training["device"] == device and json.loads((out / "training.json").read_text()) == training
    for run in training["runs"]:
        assert run["device"] == device and (run["gpu"] is None) == (device == "cpu")
        if device == "cpu":  # set in the worker's environment, read back from ATen and MKL themselves
            assert run["cpu_capability"] == "DEFAULT" and run["mkl_cbwr"] in ("COMPATIBLE", None)
        tokens = TINY.steps_of(run["arm"]) * TINY.batch * TINY.window
        assert run["wall_s"] > 0 and run["tokens_per_s"] == pytest.approx(tokens / run["wall_s"])
    assert [r["arm"] for r in training["runs"]] == ["stageA", "rescaled", "control"]
    assert set(training["runs"][0]["branches"]) == {f"stageA-step{s}" for s in (0, 4, 13, 30, 40)}


def test_the_arms_start_from_the_predecay_checkpoint_with_its_optimiser_state(tiny):
    import torch

    out, _ = tiny
    refs = smoke_refs(out, 0)
    assert refs["ext-control-step0"] == refs[PREDECAY] != refs[f"stageA-step{TINY.steps}"]
    assert _weights(out, "ext-rescaled-step0") == _weights(out, PREDECAY)  # bit for bit (its config: another base)
    saved = torch.load(out / "state" / "seed0-predecay.pt", weights_only=False)
    assert saved["step"] == TINY.ext_start == 30 and saved["device"] in ("cpu", "cuda")
    # AdamW's own step count: the arms continue its bias correction and moments, not a fresh optimiser's
    assert {float(s["step"]) for s in saved["optimizer"]["state"].values()} == {30.0}
    assert not list((out / "state").glob("seed0-[sc]*.pt"))  # the runs' resume states are gone, the kept one stays


def test_a_killed_training_resumes_to_identical_weights(tiny, tmp_path):
    """The training's worker process killed after the pre-decay state, the training rerun: it resumes, and every
    branch and every loss equal the uninterrupted training's (the arms read the first session's AdamW state)."""
    import multiprocessing
    import threading

    import torch

    out, training = tiny
    killed = tmp_path / "killed"
    killed.mkdir()
    for name in ("data", "tokenizer"):  # the same data (made once, deterministic): only the training is redone
        os.symlink(out / name, killed / name)
    failed = []
    first = threading.Thread(target=lambda: _catch(failed, lambda: train(TINY, killed, progress=False)))
    first.start()
    state, deadline = killed / "state" / "seed0-stageA.pt", time.time() + 300
    while not (state.exists() and torch.load(state, weights_only=False)["step"] >= TINY.ext_start):
        assert first.is_alive(), failed
        assert time.time() < deadline, "no resume state after the pre-decay step within 5 minutes"
        time.sleep(0.05)
    for worker in multiprocessing.active_children():  # the training's spawned worker: SIGKILL, as a crash would
        os.kill(worker.pid, signal.SIGKILL)
    first.join()
    assert failed and not (killed / "training.json").exists() and not (killed / "state" / "seed0-stageA.json").exists()
    again = train(TINY, killed, progress=False)
    assert smoke_refs(killed, 0) == smoke_refs(out, 0)
    assert [[s["loss"] for s in r["steps"]] for r in again["runs"]] == [[s["loss"] for s in r["steps"]]
                                                                         for r in training["runs"]]


def _catch(errors: list, call) -> None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 -- the killed worker's broken pool, checked by the test
        errors.append(exc)


def test_the_kernels_decide_the_bits_and_the_worker_fixes_them(tiny, tmp_path):
    """Stage A trained in this process, with the kernels it was started with (not the worker's), gives other bits:
    the settings the worker forces are not idle."""
    from qkplast.train.loop import train_arm
    from qkplast.train.model import cpu_kernels

    out, training = tiny
    if training["device"] != "cpu" or cpu_kernels()["cpu_capability"] == "DEFAULT":
        pytest.skip("needs a CPU training and a test process on ATen's vectorised kernels")
    here = tmp_path / "here"
    here.mkdir()
    for name in ("data", "tokenizer", "config.json"):  # the same data; only the kernels differ
        os.symlink(out / name, here / name)
    record = train_arm(TINY, here, 0, "stageA", device="cpu")
    assert record["cpu_capability"] != "DEFAULT"
    # the final weights differ (here even the initialisation does: torch's normal draws are vectorised kernels)
    assert _weights(here, f"stageA-step{TINY.steps}") != _weights(out, f"stageA-step{TINY.steps}")


def test_smoke_under_another_parent_kernel_environment_gives_identical_weights(smoke_training, tmp_path):
    """``qkplast train --preset smoke`` (seed 0 alone) from a parent told to use AVX2 kernels and MKL's automatic
    branch: the worker resets both, so every branch has the session's smoke training's commit."""
    out, _ = smoke_training
    other = tmp_path / "other"
    argv = [sys.executable, "-m", "qkplast.pipeline.cli", "train", "--preset", "smoke", "--seeds", "1",
            "--out", str(other), "--no-progress"]
    done = subprocess.run(argv, env=_env(ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="AUTO"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert smoke_refs(other, 0) == smoke_refs(out, 0)
    runs = json.loads((other / "training.json").read_text())["runs"]
    assert {r["cpu_capability"] for r in runs} == {"DEFAULT"}


def test_every_cpu_step_takes_the_exact_root(tiny, tmp_path, monkeypatch):
    """On the CPU the loop steps AdamW through ``qkplast.train.optim.adamw_step`` (a correctly rounded root, the
    same bits on every CPU), once per step, and never through torch's own ``step``."""
    from qkplast.train import loop
    from qkplast.train.optim import adamw_step

    out, _ = tiny
    here = tmp_path / "here"
    here.mkdir()
    for name in ("data", "tokenizer", "config.json"):
        os.symlink(out / name, here / name)
    calls = []
    monkeypatch.setattr(loop, "adamw_step", lambda optimizer: calls.append(1) or adamw_step(optimizer))
    monkeypatch.setattr("torch.optim.AdamW.step", lambda *a, **k: pytest.fail("torch's AdamW step on the CPU"))
    loop.train_arm(TINY, here, 0, "stageA", device="cpu")
    assert len(calls) == TINY.steps
