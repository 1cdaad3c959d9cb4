"""Studies: many runs (models, checkpoints, settings) as one resumable job set (``qkplast study``).

A study file (YAML) names the runs::

    name: thesis-13
    out: runs/thesis-13          # run directories live under out/<name>/
    defaults: {corpus: ..., seq_len: 131072, bucket_size: 8192, device: cuda}
    resources: {gpus: 1, timeout_min: 240, mem_gb: 64, partition: gpu, array_parallelism: 8, max_num_timeout: 5}
    models:
      - {id: Qwen/Qwen3-0.6B, rope_scaling: "yarn:4:32768"}
      - {id: HuggingFaceTB/SmolLM3-3B-checkpoints@stage1-step-40000, name: smollm3-s1-40k, seq_len: 4096}

Keys of ``defaults`` and of a model entry are :class:`~qkplast.options.CaptureOptions` fields, plus
``analysis`` (:class:`~qkplast.options.AnalysisOptions` overrides), ``id``, ``name`` and, in an
entry, ``resources`` (overrides of the study's). Each run is one submitit job; jobs with the same
resources form one SLURM array. A job is checkpointable: on timeout or preemption submitit requeues
it and it resumes from its run directory (the capture's finished parts, the analysis, the executed
notebooks are reused). A finished run writes ``RUN/study-done.json``; a second ``qkplast study``
submits only runs without it. ``OUT/study.json`` keeps every run's job id and log paths.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import traceback
from dataclasses import dataclass, field, fields
from pathlib import Path

import submitit

from qkplast.errors import QkplastError
from qkplast.options import AnalysisOptions, CaptureOptions

STAGES = ("capture", "analyze", "notebooks")
#: run directory files written by the study machinery
DONE, STATE, ATTEMPTS = "study-done.json", "study-state.json", "study-attempts.jsonl"
STUDY_JSON = "study.json"

CAPTURE_FIELDS = tuple(f.name for f in fields(CaptureOptions))
#: study resources -> submitit parameter (``slurm_`` prefixed ones only reach SLURM)
RESOURCES = {"gpus": "gpus_per_node", "timeout_min": "timeout_min", "mem_gb": "mem_gb",
             "partition": "slurm_partition", "array_parallelism": "slurm_array_parallelism",
             "cpus": "cpus_per_task", "max_num_timeout": None, "signal_delay_s": None}
DEFAULT_RESOURCES = {"timeout_min": 60, "max_num_timeout": 3, "array_parallelism": 1}
TOP_KEYS = ("name", "out", "defaults", "resources", "models", "description")
ENTRY_KEYS = (*CAPTURE_FIELDS, "analysis", "id", "name", "resources")


class StudyError(QkplastError):
    """A study file is invalid (the message names the entry and the fix)."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: where it lives and what it captures and analyses."""

    name: str
    id: str
    capture: CaptureOptions
    analysis: dict
    resources: dict
    run_dir: Path

    def to_dict(self) -> dict:
        return {"name": self.name, "id": self.id, "capture": self.capture.to_dict(), "analysis": self.analysis,
                "resources": self.resources, "run_dir": str(self.run_dir)}


@dataclass(frozen=True)
class Study:
    name: str
    out: Path
    source: Path
    runs: tuple[RunSpec, ...]
    description: str = ""
    resources: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def state_path(self) -> Path:
        return self.out / STUDY_JSON


# --------------------------------------------------------------------------- parsing and validation


def slug(text: str) -> str:
    """Default run name of an id: ``Qwen/Qwen3-0.6B`` -> ``qwen-qwen3-0.6b``."""
    return re.sub(r"[^a-z0-9._]+", "-", text.lower()).strip("-.")


def _entry_label(i: int, entry) -> str:
    ident = entry.get("name") or entry.get("id") if isinstance(entry, dict) else None
    return f"models[{i}]" + (f" ({ident})" if ident else "")


def _check_keys(where: str, mapping, allowed) -> None:
    if not isinstance(mapping, dict):
        raise StudyError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise StudyError(f"{where}: unknown key(s) {unknown}; allowed: CaptureOptions fields, "
                         f"{[k for k in allowed if k not in CAPTURE_FIELDS]}")


def _resources(where: str, res: dict) -> dict:
    _check_keys(where, res, RESOURCES)
    for k, v in res.items():
        if k != "partition" and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
            raise StudyError(f"{where}: {k} must be a non-negative number, got {v!r}")
    return res


def _run_spec(i: int, entry, defaults: dict, base_resources: dict, out: Path) -> RunSpec:
    where = _entry_label(i, entry)
    _check_keys(where, entry, ENTRY_KEYS)
    if not entry.get("id"):
        raise StudyError(f"{where}: missing 'id' (a hub id, owner/name@revision, a local directory or smollm2-135m)")
    ident = str(entry["id"])
    model, _, revision = ident.partition("@")
    merged = {**{k: v for k, v in defaults.items() if k != "analysis"},
              **{k: v for k, v in entry.items() if k in CAPTURE_FIELDS}}
    if revision and merged.get("revision") not in (None, revision):
        raise StudyError(f"{where}: id names revision {revision!r} but 'revision' is {merged['revision']!r}; give one")
    merged.setdefault("model", model)
    if revision:
        merged["revision"] = revision
    try:
        capture = CaptureOptions(**merged)
    except (TypeError, ValueError) as exc:
        raise StudyError(f"{where}: {exc}") from None
    analysis = {**(defaults.get("analysis") or {}), **(entry.get("analysis") or {})}
    try:
        AnalysisOptions.from_kwargs(None, **analysis)
    except (TypeError, ValueError) as exc:
        raise StudyError(f"{where}: analysis: {exc}") from None
    name = str(entry.get("name") or slug(ident))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise StudyError(f"{where}: name {name!r} must be letters, digits, '.', '_' or '-' (it is a directory)")
    res = {**base_resources, **_resources(f"{where}: resources", entry.get("resources") or {})}
    return RunSpec(name, ident, capture, analysis, res, out / name)


def parse_study(data: dict, source: Path, out: str | os.PathLike | None = None) -> Study:
    """Validate a study mapping; every problem is a :class:`StudyError` naming the entry."""
    _check_keys(str(source), data, TOP_KEYS)
    for key in ("name", "models"):
        if not data.get(key):
            raise StudyError(f"{source}: missing '{key}'")
    if not isinstance(data["models"], list):
        raise StudyError(f"{source}: 'models' must be a list of entries")
    defaults = data.get("defaults") or {}
    _check_keys(f"{source}: defaults", defaults, (*CAPTURE_FIELDS, "analysis"))
    resources = {**DEFAULT_RESOURCES, **_resources(f"{source}: resources", data.get("resources") or {})}
    out = Path(out or data.get("out") or Path("runs") / str(data["name"])).resolve()
    runs, seen = [], {}
    for i, entry in enumerate(data["models"]):
        spec = _run_spec(i, entry, defaults, resources, out)
        if spec.name in seen:
            raise StudyError(f"{_entry_label(i, entry)}: duplicate name {spec.name!r} (also models[{seen[spec.name]}]);"
                             " give one of them a 'name'")
        seen[spec.name] = i
        runs.append(spec)
    return Study(str(data["name"]), out, source, tuple(runs), str(data.get("description", "")), resources, data)


def load_study(path: str | os.PathLike, out: str | os.PathLike | None = None) -> Study:
    """Read and validate a study file, or the ``study.json`` of a study directory."""
    import yaml

    path = Path(path)
    if path.is_dir():
        recorded = json.loads((path / STUDY_JSON).read_text()) if (path / STUDY_JSON).exists() else None
        if recorded is None:
            raise StudyError(f"{path} is not a study directory (no {STUDY_JSON}); pass the study's YAML file")
        return parse_study(recorded["study"], Path(recorded["source"]), out or path)
    if not path.exists():
        raise StudyError(f"study file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise StudyError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_study(data or {}, path, out)


# --------------------------------------------------------------------------- one run (inside the job)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def done_stage(run_dir: Path) -> str | None:
    """The furthest stage this run finished (its marker), or None."""
    marker = Path(run_dir) / DONE
    return json.loads(marker.read_text())["stage"] if marker.exists() else None


def is_done(run_dir: Path, stage: str) -> bool:
    finished = done_stage(run_dir)
    return finished is not None and STAGES.index(finished) >= STAGES.index(stage)


def _parts_written(run_dir: Path) -> int:
    return len(list((run_dir / "capture.nc.parts").glob("doc-*.nc")))


def execute_run(spec: RunSpec, stage: str, parameters: dict | None = None) -> None:
    """The one call into :mod:`qkplast.pipeline.batch` (the only place a study reaches a run).

    ``batch.run`` stops after ``stage`` and reuses what the run directory already holds (finished capture
    parts, the analysis, executed notebooks), which is what makes a requeued job resume. ``parameters``
    reach every notebook (the book passes ``study``).
    """
    from qkplast.pipeline import batch

    analysis = AnalysisOptions.from_kwargs(None, seed=spec.capture.seed, **spec.analysis)
    batch.run(spec.capture, spec.run_dir, analysis=analysis, parameters=parameters, stage=stage, progress=False)


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


def run_dirs(study: Study, stage: str = "analyze") -> list[Path]:
    """Run directories of the study in study order that finished ``stage`` (or hold its result)."""
    need = {"capture": "capture.nc", "analyze": "metrics.nc", "notebooks": "metrics.nc"}[stage]
    return [r.run_dir for r in study.runs if is_done(r.run_dir, stage) or (r.run_dir / need).exists()]


__all__ = ["RunJob", "RunSpec", "STAGES", "Study", "StudyError", "format_status", "is_done", "load_study",
           "parse_study", "run_dirs", "slug", "status", "submit"]
