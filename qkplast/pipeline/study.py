"""Studies: many runs (models, checkpoints, settings) as one resumable job set (``qkplast study``).

A study file (YAML, its format in :mod:`qkplast.rundir.study_file`) names the runs.

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

from qkplast.errors import QkplastError
from qkplast.rundir.study_file import (ATTEMPTS, DONE, GPU_MEMORY_GB, RESOURCES, STAGES, STATE, RunSpec, Study,
                                       StudyError, done_stage, is_done)

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

    # progress as plain lines (window k of n, seconds per window, ETA): a SLURM log is a file, not a terminal
    run(spec.capture, spec.run_dir, analysis=spec.analysis_options, parameters=parameters, stage=stage,
        progress="lines")


class RunJob(submitit.helpers.Checkpointable):
    """The callable submitit pickles for one run; requeued on timeout, it resumes from ``run_dir``.

    Checkpointable (``submitit.helpers.Checkpointable``): its ``checkpoint`` resubmits the same
    object, and everything it needs to resume is on disk in the run directory.
    """

    def __init__(self, spec: RunSpec, stage: str, commit: str | None = None, parameters: dict | None = None):
        self.spec, self.stage, self.commit, self.parameters = spec, stage, commit, dict(parameters or {})

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
                   "metrics_done": (run_dir / "metrics.nc").exists(),
                   "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "commit": self.commit}
        with open(run_dir / ATTEMPTS, "a") as f:
            f.write(json.dumps(attempt) + "\n")
        _write_json(run_dir / STATE, {"state": "running", **attempt})
        try:
            check_commit(spec, self.commit)
            execute_run(spec, self.stage, self.parameters)
        except Exception as exc:  # recorded for --status, then re-raised so the job fails visibly
            _write_json(run_dir / STATE, {"state": "failed", "reason": f"{type(exc).__name__}: {exc}".splitlines()[0],
                                          "traceback": traceback.format_exc(), **attempt})
            raise
        _write_json(run_dir / DONE, {"stage": self.stage, "finished": time.time(), "run": spec.to_dict()})
        _write_json(run_dir / STATE, {"state": "done", **attempt})
        return "done"


def resolved_commit(spec: RunSpec) -> str | None:
    """The commit a run's model name resolves to now (config only; None for a model outside a hub cache)."""
    from qkplast.capture.models import load_config, quiet_transformers

    with quiet_transformers():
        return load_config(spec.capture.model, revision=spec.capture.revision)[1].get("commit")


def check_commit(spec: RunSpec, commit: str | None) -> None:
    """Refuse to (re)start a run whose model name now resolves to another commit than at validation."""
    if commit is None:
        return
    now = resolved_commit(spec)
    if now != commit:
        raise StudyError(f"run {spec.name}: {spec.capture.model}@{spec.capture.revision or 'main'} resolved to commit "
                         f"{commit} when the study was validated but to {now} now (the branch moved); pin "
                         f"{spec.capture.model}@{commit} in the study, or validate and submit it again")


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
        if "gpu_type" in resources:  # a typed request: --gres=gpu:TYPE:N instead of --gpus-per-node=N
            params.pop("gpus_per_node", None)
            params["slurm_gres"] = f"gpu:{resources['gpu_type']}:{int(resources.get('gpus', 1))}"
        params["name"] = f"qkplast-{study.name}"
    elif kind == "local":
        ex = submitit.LocalExecutor(folder=folder, max_num_timeout=int(resources.get("max_num_timeout", 3)))
        params = {k: v for k, v in params.items() if k in ("timeout_min", "gpus_per_node")}
        if "signal_delay_s" in resources:
            params["signal_delay_s"] = int(resources["signal_delay_s"])
        # each job is given its own GPUs at submission (submit); none unless asked
        params.setdefault("gpus_per_node", 0)
    else:
        raise StudyError(f"unknown executor {kind!r}; use local or slurm")
    ex.update_parameters(**params)
    return ex


def visible_gpus() -> list[int]:
    """The GPUs this host lets a process use: ``CUDA_VISIBLE_DEVICES`` when set, else every CUDA device."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [x.strip() for x in env.split(",") if x.strip()]
        return [int(x) for x in ids] if all(x.isdigit() for x in ids) else list(range(len(ids)))
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def gpus_per_job(spec: RunSpec) -> int:
    """GPUs one job of this run needs: ``resources.gpus``, else one when its capture runs on CUDA."""
    if "gpus" in spec.resources:
        return int(spec.resources["gpus"])
    return 1 if spec.capture.device.startswith("cuda") else 0


def local_waves(runs: list[RunSpec], parallelism: int, gpus: list[int]) -> list[list[tuple[RunSpec, tuple]]]:
    """The local executor's waves: at most ``parallelism`` jobs at once, and on a GPU host no more than the
    visible GPUs hold, each job with its own devices (``CUDA_VISIBLE_DEVICES``).

    Raises
    ------
    StudyError
        A run needs more GPUs than are visible.
    """
    need = max((gpus_per_job(r) for r in runs), default=0)
    if need > len(gpus):
        raise StudyError(f"run {next(r.name for r in runs if gpus_per_job(r) == need)} needs {need} GPU(s) but "
                         f"{len(gpus)} are visible here (CUDA_VISIBLE_DEVICES); use --executor slurm or fewer gpus")
    width = max(1, int(parallelism))
    if need:
        width = min(width, len(gpus) // need)
    waves = []
    for start in range(0, len(runs), width):
        wave = runs[start:start + width]
        waves.append([(r, tuple(gpus[j * need:(j + 1) * need]) if need else ()) for j, r in enumerate(wave)])
    return waves


def _read_state(study: Study) -> dict:
    if study.state_path.exists():
        return json.loads(study.state_path.read_text())
    return {"runs": {}}


def _record(study: Study, stage: str, kind: str, jobs: dict, resolved: dict | None = None) -> None:
    state = _read_state(study)
    state.update({"name": study.name, "source": str(study.source), "study": study.raw, "order": [r.name for r in study.runs]})
    if resolved:
        state.setdefault("resolved", {}).update(resolved)
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
    """Validate, then submit every run not yet done to ``stage``: one job each, one array per resource set.

    Nothing is submitted unless every run to submit passes :func:`validate`. The local executor runs
    ``array_parallelism`` jobs at a time (no more than the visible GPUs hold, each job on its own) and
    waits for them (its jobs die with this process); SLURM submits and returns. Returns
    ``{run name: job}`` of what was submitted.
    """
    if stage not in STAGES:
        raise StudyError(f"unknown stage {stage!r}; use one of {STAGES}")
    todo = _submittable(study, list(study.runs), stage, echo)
    if executor == "local":
        for group in _groups(todo):
            local_waves(group, group[0].resources.get("array_parallelism", 1), visible_gpus())
    resolved = validate(study, todo, echo, executor=executor) if todo else {}
    _record(study, stage, executor, {}, resolved)
    submitted = {}
    for group in _groups(todo):
        ex = _executor(study, executor, group[0].resources)
        if executor == "slurm":
            with ex.batch():
                jobs = [ex.submit(_job(study, r, stage, resolved)) for r in group]
            submitted.update(_note(study, stage, executor, group, jobs, echo))
        else:
            for wave in local_waves(group, group[0].resources.get("array_parallelism", 1), visible_gpus()):
                live = {r.name for r in _submittable(study, [r for r, _ in wave], stage, lambda line: None)}
                wave = [(r, devices) for r, devices in wave if r.name in live]
                jobs = []
                for r, devices in wave:
                    ex.update_parameters(gpus_per_node=len(devices), visible_gpus=devices)
                    jobs.append(ex.submit(_job(study, r, stage, resolved)))
                submitted.update(_note(study, stage, executor, [r for r, _ in wave], jobs, echo))
                for (r, _), job in zip(wave, jobs):
                    _wait_local(r, job, echo)
    return submitted


def _job(study: Study, spec: RunSpec, stage: str, resolved: dict) -> "RunJob":
    return RunJob(spec, stage, (resolved.get(spec.name) or {}).get("commit"), study.parameters)


def dry_run(study: Study, executor: str = "slurm", stage: str = "notebooks", echo=print) -> list[str]:
    """Validate, then show what :func:`submit` would submit, submitting nothing; returns the batch scripts.

    For SLURM, the batch script submitit would write for each array (one per resource set), exactly as
    generated; for the local executor, the waves and the GPUs each job would get.
    """
    if stage not in STAGES:
        raise StudyError(f"unknown stage {stage!r}; use one of {STAGES}")
    todo = _submittable(study, list(study.runs), stage, echo)
    validate(study, todo, echo, executor=executor)
    scripts = []
    for group in _groups(todo):
        names = ", ".join(r.name for r in group)
        if executor == "local":
            for i, wave in enumerate(local_waves(group, group[0].resources.get("array_parallelism", 1),
                                                 visible_gpus()), 1):
                echo(f"wave {i}: " + ", ".join(f"{r.name} (CUDA_VISIBLE_DEVICES={','.join(map(str, d)) or 'none'})"
                                               for r, d in wave))
            continue
        script = slurm_script(study, group)
        scripts.append(script)
        echo(f"# sbatch script of the array of {len(group)} run(s): {names}")
        echo(script)
    echo(f"dry run: {len(todo)} run(s) validated, nothing submitted")
    return scripts


def slurm_script(study: Study, group: list[RunSpec]) -> str:
    """The sbatch script submitit generates for one array of runs (``--array=0-N%parallelism``), unsubmitted."""
    ex = _executor(study, "slurm", group[0].resources)
    slurm = ex._executor  # submitit's SlurmExecutor behind the AutoExecutor: the one that writes the script
    slurm.parameters["map_count"] = len(group)
    try:
        return slurm._make_submission_file_text(slurm._submitit_command_str, "dry-run")
    finally:
        slurm.parameters.pop("map_count", None)


# --------------------------------------------------------------------------- validation (no weights)


def validate(study: Study, runs: list[RunSpec] | None = None, echo=print, *, executor: str = "slurm") -> dict:
    """Check every run on this host without weights; raise when any fails, after one line per failing run.

    Per run: the model's config and tokenizer resolve (offline from the hub cache when ``HF_HUB_OFFLINE``),
    the window fits the (RoPE-scaled) config, the attention kernel is linear in ``seq_len``, the corpus fills
    ``docs`` windows with that run's tokenizer, and the planned peak memory fits the requested GPU
    (``resources.gpu_memory_gb``, or the memory of ``resources.gpu_type``; the host's for CPU runs of the
    local executor). Returns ``{run: {"model", "revision", "commit"}}``, the commit each name resolved to.

    Raises
    ------
    StudyError
        One or more runs failed (each printed through ``echo``); nothing should be submitted.
    """
    runs = list(study.runs if runs is None else runs)
    resolved, failed, counted = {}, [], {}
    for spec in runs:
        try:
            commit, note = _validate_run(spec, counted, executor)
        except (QkplastError, OSError) as exc:
            failed.append(spec.name)
            echo(f"{spec.name}: INVALID: {' '.join(str(exc).split())}")
            continue
        resolved[spec.name] = {"model": spec.capture.model, "revision": spec.capture.revision, "commit": commit}
        echo(f"{spec.name}: ok ({spec.capture.model}@{spec.capture.revision or 'main'} -> {commit or 'local'}; {note})")
    if failed:
        raise StudyError(f"{len(failed)} of {len(runs)} run(s) failed validation ({', '.join(failed)}; one line each "
                         "above); nothing submitted")
    return resolved


def _gpu_memory(resources: dict) -> float | None:
    if "gpu_memory_gb" in resources:
        return float(resources["gpu_memory_gb"])
    return GPU_MEMORY_GB.get(str(resources.get("gpu_type", "")).lower())


def _validate_run(spec: RunSpec, counted: dict, executor: str) -> tuple[str | None, str]:
    """One run's plan (:func:`qkplast.capture.plan.plan_capture`: config and tokenizer loaded once, the corpus
    counted once per corpus setting across the study) and its problems raised in turn: window, kernel, memory,
    corpus. The device need not exist on this host (a GPU run is validated on a login node)."""
    from qkplast.capture.models import ModelError, quiet_transformers
    from qkplast.capture.plan import PlanError, plan_capture

    o = spec.capture
    cuda = o.device.startswith("cuda")
    memory = _gpu_memory(spec.resources) if cuda else (spec.resources.get("mem_gb") if executor == "slurm" else None)
    # the windows depend on the tokenizer and the resolved window only: one count per such setting
    key = (o.model, o.revision, o.tokenizer, o.corpus, o.text_field, o.id_field, o.seq_len, o.short_docs, o.docs)
    with quiet_transformers():
        plan = plan_capture(o, device_memory_gb=memory, count=key not in counted, gpus=max(1, gpus_per_job(spec)))
        if plan.length_problem:
            raise ModelError(plan.length_problem)
        if plan.kernel_problem:
            raise PlanError(plan.kernel_problem)
        problem = plan.memory_problem()
        if problem:
            raise PlanError(problem + " (resources.gpu_memory_gb / gpu_type)")
        if key not in counted:
            error = plan.corpus_error()
            if error is not None:
                raise error
            counted[key] = plan.windows
    p = plan.options
    checked = (f"expected peak {plan.peak_gb:.1f} GiB of {plan.device_memory_gb:.0f}" if plan.device_memory_gb
               else "memory not checked (set resources.gpu_memory_gb)")
    return plan.commit, f"{counted[key]} windows of {p.seq_len} tokens; {checked}"


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


__all__ = ["RunJob", "check_commit", "dry_run", "execute_run", "format_status", "gpus_per_job", "local_waves",
           "resolved_commit", "slurm_script", "status", "submit", "validate", "visible_gpus"]
