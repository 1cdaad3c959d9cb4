"""Studies as a user runs them (``qkplast study`` in a child process): submitit jobs that resume after a forced
timeout (local executor), and a real one-node SLURM cluster running a two-run study."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers as T

from qkplast.pipeline.study import format_status, status
from qkplast.rundir.study_file import STAGES, is_done, load_study
from tests.helpers import COMMON, ROOT, tiny_tokenizer, write_yaml


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    """A random Llama of 4 layers, width 512 (38 MB): a 1024-token window costs a measurable forward."""
    path = tmp_path_factory.mktemp("wide-llama")
    config = {**COMMON, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 64, "num_hidden_layers": 4, "max_position_embeddings": 1024}
    T.LlamaForCausalLM(T.LlamaConfig(**config)).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def _qkplast(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout)


def _signal_when_parts(proc, run_dir: Path, parts: int, timeout: float = 900) -> int | None:
    """While ``qkplast study`` runs in ``proc``: once ``parts`` documents of ``run_dir``'s capture are written, send
    its job's process the signal submitit's local executor sends at a job's timeout (USR2), once. Returns the
    signalled process id (None when the capture ended first)."""
    from submitit.local.local import LocalJobEnvironment

    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        written = len(list((run_dir / "capture.nc.parts").glob("doc-*.nc")))
        state = run_dir / "study-state.json"
        if written >= parts and state.exists():
            pid = json.loads(state.read_text())["pid"]
            os.kill(pid, LocalJobEnvironment._usr_sig())
            return pid
        time.sleep(0.1)
    return None


def test_local_jobs_requeued_after_a_timeout_resume_from_their_parts(tmp_path, wide_dir):
    # Run "a" gets the timeout signal (the one submitit's local executor sends a job signal_delay_s before its
    # limit) once 4 of its 24 windows are written: sent by the test when the parts are on disk, not by a clock, so
    # that a fast machine cannot finish the capture in the first attempt (at 30 s a 2-core Intel Xeon captured all
    # 90 windows of an earlier version of this test before the clock's signal came) and a slow one does not need
    # many attempts (the clock's version took 6 minutes on the 2-core AMD EPYC). The job checkpoints, exits with
    # submitit's requeue status and the executor starts it again as the same job, which resumes from the parts.
    # submitit counts a signal as the timeout (not a preemption) when the job has run for its guaranteed time,
    # min(0.8 x limit, limit - 10 min): under a 10-minute limit, always, and the executor's own signal (at 9.5
    # minutes) never comes. Run "b" is small and has its own resources (a second job group); it finishes at once.
    docs = 24
    study = write_yaml(tmp_path / "s.yaml", {
        "name": "requeue", "out": str(tmp_path / "out"),
        "defaults": {"corpus": "stdlib-code", "seq_len": 1024, "bucket_size": 64, "samples_per_bucket": 2,
                     "heads": 32, "docs": docs},
        "resources": {"timeout_min": 10, "max_num_timeout": 15},
        "models": [{"id": str(wide_dir), "name": "a"},
                   {"id": str(wide_dir), "name": "b", "seed": 1, "docs": 2, "resources": {"timeout_min": 10}}]})
    proc = subprocess.Popen([sys.executable, "-m", "qkplast.pipeline.cli", "study", str(study), "--executor", "local",
                             "--stage", "capture"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    signalled = _signal_when_parts(proc, tmp_path / "out" / "a", parts=4)
    stdout, stderr = proc.communicate(timeout=900)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert signalled is not None, "the capture of run a ended before 4 of its parts were written: " + r.stdout
    jobs = json.loads((tmp_path / "out" / "study.json").read_text())["runs"]
    first_job = jobs["a"]["job_id"]
    # On a busy machine the local executor's retries (6 at most) may end before the capture does; running
    # the study again resumes it (the other way a run resumes), and submits only the unfinished run.
    for _ in range(3):
        if r.returncode == 0:
            break
        assert "a: failed" in r.stdout and "run the study again to resume it" in r.stdout, r.stdout + r.stderr
        r = _qkplast("study", str(study), "--executor", "local", "--stage", "capture")
        assert "b: done (capture), not submitted" in r.stdout
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = json.loads((tmp_path / "out" / "study.json").read_text())["runs"]
    assert r.stdout.strip().splitlines()[-2:] == [f"{n}: done (job {jobs[n]['job_id']})" for n in ("a", "b")]
    from qkplast.capture_format import open_capture

    attempts = {n: [json.loads(line) for line in (tmp_path / "out" / n / "study-attempts.jsonl").read_text().splitlines()]
                for n in ("a", "b")}
    a = attempts["a"]
    first = [x for x in a if x["job_id"] == first_job]
    assert len(first) >= 2, f"the job was never requeued ({a})"  # requeued as the same job
    assert first[0]["pid"] == signalled and first[1]["pid"] != signalled  # the signalled attempt, then a new process
    # an attempt that starts after the prose capture is complete (the batch then captures the code corpus)
    # finds its parts merged into capture.nc: it counts as all documents done
    resumed = [docs if x.get("capture_done") else x["parts_at_start"] for x in a[1:]]
    assert max(x["parts_at_start"] for x in first[1:]) > 0, f"no requeued attempt found parts to resume from ({a})"
    assert resumed == sorted(resumed) and resumed[-1] <= docs  # parts only added; the last attempt finished the rest
    assert len(attempts["b"]) == 1
    assert "timed-out" in (tmp_path / "out" / "logs" / first_job / f"{first_job}_0_log.err").read_text()
    for name, docs in (("a", docs), ("b", 2)):
        run = tmp_path / "out" / name
        cap = open_capture(run / "capture.nc")
        assert cap.attrs["docs"] == docs and len(set(cap.doc.values)) == docs
        assert is_done(run, "capture") and not is_done(run, "analyze")
        assert not (run / "capture.nc.parts").exists()
    assert all(Path(v["stdout"]).exists() for v in jobs.values())
    # a second invocation submits nothing: both runs are done to this stage
    again = _qkplast("study", str(study), "--executor", "local", "--stage", "capture")
    assert again.returncode == 0 and "submitted job" not in again.stdout and again.stdout.count("not submitted") == 2


def test_a_two_run_study_runs_on_a_one_node_slurm_cluster(tmp_path, model_dir, slurm):
    study = write_yaml(tmp_path / "s.yaml", {
        "name": "slurm", "out": str(tmp_path / "out"),
        "defaults": {"corpus": "pydoc-topics", "seq_len": 64, "bucket_size": 16, "samples_per_bucket": 2,
                     "heads": 5, "docs": 4},
        "resources": {"timeout_min": 10, "mem_gb": 1, "cpus": 1, "array_parallelism": 2, "partition": "debug"},
        "models": [{"id": str(model_dir), "name": "a"}, {"id": str(model_dir), "name": "b", "seed": 1}]})
    env = {**_env(), **{"SLURM_CONF": str(slurm.conf)}}
    r = _qkplast("study", str(study), "--executor", "slurm", "--stage", "analyze", env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "submitted 2 job(s)" in r.stdout
    jobs = json.loads((tmp_path / "out" / "study.json").read_text())["runs"]
    array = {v["job_id"].split("_")[0] for v in jobs.values()}
    assert len(array) == 1 and sorted(v["job_id"].split("_")[1] for v in jobs.values()) == ["0", "1"]  # one array
    deadline, lines = time.monotonic() + 240, ""
    while time.monotonic() < deadline:
        s = _qkplast("study", str(study), "--status", env=env, timeout=60)
        lines = s.stdout
        if all(": done" in line or ": failed" in line for line in lines.splitlines()):
            break
        time.sleep(3)
    assert lines.splitlines() == [f"{n}: done (job {jobs[n]['job_id']})" for n in ("a", "b")], (
        lines + "\n" + "\n".join(Path(v["stderr"]).read_text()[-2000:] for v in jobs.values() if Path(v["stderr"]).exists()))
    for name in ("a", "b"):
        assert (tmp_path / "out" / name / "metrics.nc").exists() and is_done(tmp_path / "out" / name, "analyze")
    assert STAGES == ("capture", "analyze", "notebooks") and "done" in format_status(status(load_study(study)))
