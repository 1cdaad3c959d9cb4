"""Studies: many runs (models, checkpoints, settings) as one resumable job set (``qkplast study``).

A study file (YAML) names the runs::

    name: thesis-13
    out: runs/thesis-13          # run directories live under out/<name>/
    defaults: {corpus: ..., seq_len: 131072, bucket_size: 8192, device: cuda}
    resources: {gpus: 1, timeout_min: 240, mem_gb: 64, partition: gpu, array_parallelism: 8, max_num_timeout: 5}
    models:
      - {id: Qwen/Qwen3-0.6B, rope_scaling: "yarn:4:32768"}
      - {id: HuggingFaceTB/SmolLM3-3B-checkpoints@stage1-step-40000, name: smollm3-s1-40k, seq_len: 4096}

The file is parsed and validated by :mod:`qkplast.rundir.study_file`. Each run is one submitit job; jobs with the same
resources form one SLURM array. A job is checkpointable: on timeout or preemption submitit requeues
it and it resumes from its run directory (the capture's finished parts, the analysis, the executed
notebooks are reused). A finished run writes ``RUN/study-done.json``; a second ``qkplast study``
submits only runs without it. ``OUT/study.json`` keeps every run's job id and log paths.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import traceback
from pathlib import Path

import submitit

from qkplast.rundir.study_file import (ATTEMPTS, DONE, RESOURCES, STAGES, STATE, RunSpec, Study, StudyError,
                                       done_stage, is_done)

# --------------------------------------------------------------------------- one run (inside the job)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def _parts_written(run_dir: Path) -> int:
    return len(list((run_dir / "capture.nc.parts").glob("doc-*.nc")))


def execute_run(spec: RunSpec, stage: str, parameters: dict | None = None) -> None:
    """The one call into :func:`qkplast.pipeline.stages.run` (the only place a study reaches a run).

    ``run`` stops after ``stage`` and reuses what the run directory already holds (finished capture
    parts, the analysis, executed notebooks), which is what makes a requeued job resume. ``parameters``
    reach every notebook (the book passes ``study``).
    """
    from qkplast.pipeline.stages import run

    run(spec.capture, spec.run_dir, analysis=spec.analysis_options, parameters=parameters, stage=stage,
        progress=False)


class RunJob(submitit.helpers.Checkpointable):
    """The callable submitit pickles for one run; requeued on timeout, it resumes from ``run_dir``.

    Checkpointable (``submitit.helpers.Checkpointable``): its ``checkpoint`` resubmits the same
    object, and everything it needs to resume is on disk in the run directory.
    """

    def __init__(self, spec: RunSpec, stage: str):
        self.spec, self.stage = spec, stage

    def __call__(self) -> str:
        spec, run_dir = self.spec, self.spec.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        if is_done(run_dir, self.stage):
            return "done"
        other = json.loads((run_dir / STATE).read_text()) if (run_dir / STATE).exists() else {}
        if (other.get("state") == "running" and other.get("host") == os.uname().nodename
                and other.get("pid") != os.getpid() and _alive(other)):
            raise StudyError(f"run {spec.name} is being written by process {other['pid']} (job {other.get('job_id')}); "
                             "not starting a second writer")
        attempt = {"started": time.time(), "job_id": _job_id(), "host": os.uname().nodename, "pid": os.getpid(),
                   "parts_at_start": _parts_written(run_dir), "capture_done": (run_dir / "capture.nc").exists(),
                   "metrics_done": (run_dir / "metrics.nc").exists()}
        with open(run_dir / ATTEMPTS, "a") as f:
            f.write(json.dumps(attempt) + "\n")
        _write_json(run_dir / STATE, {"state": "running", **attempt})
        try:
            execute_run(spec, self.stage)
        except Exception as exc:  # recorded for --status, then re-raised so the job fails visibly
            _write_json(run_dir / STATE, {"state": "failed", "reason": f"{type(exc).__name__}: {exc}".splitlines()[0],
                                          "traceback": traceback.format_exc(), **attempt})
            raise
        _write_json(run_dir / DONE, {"stage": self.stage, "finished": time.time(), "run": spec.to_dict()})
        _write_json(run_dir / STATE, {"state": "done", **attempt})
        return "done"


def _job_id() -> str | None:
    try:
        return submitit.JobEnvironment().job_id
    except RuntimeError:
        return None


# --------------------------------------------------------------------------- submission


def _executor(study: Study, kind: str, resources: dict):
    folder = study.out / "logs" / "%j"
    params = {v: resources[k] for k, v in RESOURCES.items() if v and k in resources}
    if kind == "slurm":
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm",
                                   slurm_max_num_timeout=int(resources.get("max_num_timeout", 3)))
        if "signal_delay_s" in resources:
            params["slurm_signal_delay_s"] = int(resources["signal_delay_s"])
        params["name"] = f"qkplast-{study.name}"
    elif kind == "local":
        ex = submitit.LocalExecutor(folder=folder, max_num_timeout=int(resources.get("max_num_timeout", 3)))
        params = {k: v for k, v in params.items() if k in ("timeout_min", "gpus_per_node")}
        if "signal_delay_s" in resources:
            params["signal_delay_s"] = int(resources["signal_delay_s"])
        # the local executor cannot share GPUs between jobs: give them none unless asked
        params.setdefault("gpus_per_node", 0)
    else:
        raise StudyError(f"unknown executor {kind!r}; use local or slurm")
    ex.update_parameters(**params)
    return ex


def _read_state(study: Study) -> dict:
    if study.state_path.exists():
        return json.loads(study.state_path.read_text())
    return {"runs": {}}


def _record(study: Study, stage: str, kind: str, jobs: dict) -> None:
    state = _read_state(study)
    state.update({"name": study.name, "source": str(study.source), "study": study.raw, "order": [r.name for r in study.runs]})
    for name, job in jobs.items():
        state["runs"][name] = {"job_id": str(job.job_id), "executor": kind, "stage": stage, "submitted": time.time(),
                               "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr)}
    study.out.mkdir(parents=True, exist_ok=True)
    _write_json(study.state_path, state)


def _groups(runs) -> list[list[RunSpec]]:
    groups: dict[str, list[RunSpec]] = {}
    for r in runs:
        groups.setdefault(json.dumps(r.resources, sort_keys=True), []).append(r)
    return list(groups.values())


def submit(study: Study, executor: str = "local", stage: str = "notebooks", echo=print) -> dict:
    """Submit every run not yet done to ``stage``: one job each, one array per resource set.

    The local executor runs ``array_parallelism`` jobs at a time and waits for them (its jobs die with
    this process); SLURM submits and returns. Returns ``{run name: job}`` of what was submitted.
    """
    if stage not in STAGES:
        raise StudyError(f"unknown stage {stage!r}; use one of {STAGES}")
    todo = _submittable(study, list(study.runs), stage, echo)
    _record(study, stage, executor, {})
    submitted = {}
    for group in _groups(todo):
        ex = _executor(study, executor, group[0].resources)
        if executor == "slurm":
            with ex.batch():
                jobs = [ex.submit(RunJob(r, stage)) for r in group]
            submitted.update(_note(study, stage, executor, group, jobs, echo))
        else:
            width = max(1, int(group[0].resources.get("array_parallelism", 1)))
            for start in range(0, len(group), width):
                wave = _submittable(study, group[start:start + width], stage, lambda line: None)
                jobs = [ex.submit(RunJob(r, stage)) for r in wave]
                submitted.update(_note(study, stage, executor, wave, jobs, echo))
                for r, job in zip(wave, jobs):
                    _wait_local(r, job, echo)
    return submitted


def _submittable(study: Study, runs: list[RunSpec], stage: str, echo) -> list[RunSpec]:
    """The runs to submit now: not done to ``stage`` and not queued or running in another job (two jobs
    writing one run directory would interleave its parts)."""
    live = {row["run"]: row for row in status(study, stage) if row["active"]}
    todo = []
    for r in runs:
        if is_done(r.run_dir, stage):
            echo(f"{r.name}: done ({done_stage(r.run_dir)}), not submitted")
        elif r.name in live:
            echo(f"{r.name}: {live[r.name]['state']} (job {live[r.name]['job_id']}), not submitted")
        else:
            todo.append(r)
    return todo


def _note(study, stage, executor, runs, jobs, echo) -> dict:
    pairs = {r.name: j for r, j in zip(runs, jobs)}
    _record(study, stage, executor, pairs)
    for name, job in pairs.items():
        echo(f"{name}: submitted job {job.job_id} ({executor}, stage {stage}); log {job.paths.stdout}")
    return pairs


def _wait_local(spec: RunSpec, job, echo) -> None:
    try:
        job.result()
    except Exception:  # the run's state file and log say why (--status); the other runs go on
        echo(f"{spec.name}: ended with an error; log {job.paths.stderr}")
    else:
        echo(f"{spec.name}: done")


# --------------------------------------------------------------------------- status


def _slurm_active(job_ids: list[str]) -> dict[str, str]:
    """SLURM state of jobs still known to the controller (squeue), by job id."""
    if not job_ids:
        return {}
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(job_ids)], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


def status(study: Study, stage: str | None = None) -> list[dict]:
    """One record per run: ``state`` in pending, running, done, failed; ``reason`` and ``log`` where known."""
    recorded = _read_state(study).get("runs", {})
    active = _slurm_active([v["job_id"] for v in recorded.values() if v.get("executor") == "slurm"])
    rows = []
    for r in study.runs:
        job = recorded.get(r.name, {})
        want = stage or job.get("stage", "notebooks")
        row = {"run": r.name, "state": "pending", "job_id": job.get("job_id"), "log": job.get("stdout"), "reason": "",
               "active": False}
        run_state = json.loads((r.run_dir / STATE).read_text()) if (r.run_dir / STATE).exists() else {}
        if is_done(r.run_dir, want):
            row["state"] = "done"
        elif job.get("executor") == "slurm" and job.get("job_id") in active:
            slurm_state = active[job["job_id"]]
            row["state"] = "running" if slurm_state in ("RUNNING", "COMPLETING") else "pending"
            row.update(reason=slurm_state.lower(), active=True)
        elif run_state.get("state") == "failed":
            row.update(state="failed", reason=run_state.get("reason", ""))
        elif run_state.get("state") == "running" and (job.get("executor") == "slurm" or not _alive(run_state)):
            row.update(state="failed", reason="the job ended without finishing (killed, out of memory, or out of "
                                              "requeues after timeouts); run the study again to resume it, or raise "
                                              "resources.timeout_min or max_num_timeout")
        elif run_state.get("state") == "running":
            row.update(state="running", active=True)
        rows.append(row)
    return rows


def _alive(run_state: dict) -> bool:
    """Whether the local process that wrote a running state still exists."""
    if run_state.get("host") != os.uname().nodename or not run_state.get("pid"):
        return True  # cannot tell from here
    try:
        os.kill(int(run_state["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def format_status(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        line = f"{row['run']}: {row['state']}"
        if row["job_id"]:
            line += f" (job {row['job_id']})"
        if row["state"] == "failed":
            line += f": {row['reason']}; log {row['log']}"
        elif row["reason"]:
            line += f" [{row['reason']}]"
        lines.append(line)
    return "\n".join(lines)


__all__ = ["RunJob", "execute_run", "format_status", "status", "submit"]
