"""The study file: many runs (models, checkpoints, settings) named in one YAML file, parsed and validated.

A study file names the runs::

    name: thesis-13
    out: runs/thesis-13          # run directories live under out/<name>/
    defaults: {corpus: ..., seq_len: 131072, bucket_size: 8192, device: cuda}
    resources: {gpus: 1, timeout_min: 240, mem_gb: 64, partition: gpu, array_parallelism: 8, max_num_timeout: 5}
    models:
      - {id: Qwen/Qwen3-0.6B, rope_scaling: "yarn:4:32768"}
      - {id: HuggingFaceTB/SmolLM3-3B-checkpoints@stage1-step-40000, name: smollm3-s1-40k, seq_len: 4096}

Keys of ``defaults`` and of a model entry are :class:`~qkplast.options.CaptureOptions` fields, plus
``analysis`` (:class:`~qkplast.options.AnalysisOptions` overrides), ``id``, ``name`` and, in an
entry, ``resources`` (overrides of the study's: :data:`RESOURCES`, SLURM's ``account``, ``qos``,
``constraint``, ``gpu_type``, ``setup`` and ``sbatch`` among them). At the top, ``allow_floating: true``
accepts revisions that are branch or tag names (:func:`is_pinned`; refused otherwise, naming the entry) and
``parameters`` sets notebook parameters for every run. Parsing imports nothing that submits jobs: the
submission (:mod:`qkplast.pipeline.study`) and the cross-run tables (:mod:`qkplast.results.crossrun`)
both read studies from here. A finished run writes ``RUN/study-done.json`` (:func:`is_done`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from qkplast.errors import QkplastError
from qkplast.options import AnalysisOptions, CaptureOptions, split_revision

#: run directory files written by the study machinery
DONE, STATE, ATTEMPTS = "study-done.json", "study-state.json", "study-attempts.jsonl"
#: The products of a run in the order ``qkplast run`` makes them; a run (or a study's job) stops after one. Defined
#: here, in the module that imports neither numpy nor xarray, so that the command line's parsers read it cheaply;
#: :mod:`~qkplast.rundir.products` re-exports it.
STAGES = ("capture", "analyze", "notebooks")
STUDY_JSON = "study.json"

CAPTURE_FIELDS = tuple(f.name for f in fields(CaptureOptions))
#: study resources -> submitit parameter (``slurm_`` prefixed ones only reach SLURM; None: read by qkplast)
RESOURCES = {"gpus": "gpus_per_node", "timeout_min": "timeout_min", "mem_gb": "mem_gb",
             "partition": "slurm_partition", "array_parallelism": "slurm_array_parallelism",
             "cpus": "cpus_per_task", "max_num_timeout": None, "signal_delay_s": None,
             "account": "slurm_account", "qos": "slurm_qos", "constraint": "slurm_constraint",
             "gpu_type": None, "setup": "slurm_setup", "sbatch": "slurm_additional_parameters",
             "gpu_memory_gb": None}
#: resources given as text (the others are numbers, but ``setup``, shell lines, and ``sbatch``, a mapping)
TEXT_RESOURCES = ("partition", "account", "qos", "constraint", "gpu_type")
#: memory of one GPU of a named ``gpu_type`` (GiB), for the validation's memory check when ``gpu_memory_gb`` is
#: not given; the largest published variant of each
GPU_MEMORY_GB = {"a100": 80, "h100": 80, "h200": 141, "b200": 180, "l40s": 48, "a40": 48, "v100": 32, "a10": 24,
                 "rtx6000": 48}
DEFAULT_RESOURCES = {"timeout_min": 60, "max_num_timeout": 3, "array_parallelism": 1}
TOP_KEYS = ("name", "out", "defaults", "resources", "models", "description", "allow_floating", "parameters")
#: a pinned revision: a full commit hash (a branch or tag name can move, so it floats)
_COMMIT = re.compile(r"[0-9a-f]{40}")
ENTRY_KEYS = (*CAPTURE_FIELDS, "analysis", "id", "name", "resources")

__all__ = ["ATTEMPTS", "DONE", "GPU_MEMORY_GB", "STATE", "STUDY_JSON", "RunSpec", "Study", "StudyError", "done_stage",
           "is_done", "is_pinned", "load_study", "parse_study", "run_dirs", "slug"]


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

    @property
    def analysis_options(self) -> AnalysisOptions:
        """The run's analysis options: the study's ``analysis`` overrides, seeded by the capture's seed."""
        return AnalysisOptions.from_kwargs(AnalysisOptions(seed=self.capture.seed), **self.analysis)

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
    allow_floating: bool = False
    parameters: dict = field(default_factory=dict)  # notebook parameters of every run (``-p`` of qkplast run)

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
    if not isinstance(res, dict):
        raise StudyError(f"{where}: expected a mapping, got {type(res).__name__}")
    unknown = sorted(set(res) - set(RESOURCES))
    if unknown:
        raise StudyError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(RESOURCES)}")
    res = dict(res)
    for k, v in res.items():
        if k in TEXT_RESOURCES:
            if not isinstance(v, str) or not v.strip():
                raise StudyError(f"{where}: {k} must be a non-empty string, got {v!r}")
        elif k == "setup":
            lines = [v] if isinstance(v, str) else v
            if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
                raise StudyError(f"{where}: setup must be a shell line or a list of them, got {v!r}")
            res[k] = list(lines)
        elif k == "sbatch":
            if not isinstance(v, dict) or not all(isinstance(x, str) and isinstance(y, (str, int, float, bool))
                                                  for x, y in v.items()):
                raise StudyError(f"{where}: sbatch must map sbatch option names to values "
                                 f"(e.g. {{exclusive: true, mail-type: END}}), got {v!r}")
            res[k] = {x.lstrip("-").replace("-", "_"): y for x, y in v.items()}
        elif not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise StudyError(f"{where}: {k} must be a non-negative number, got {v!r}")
    return res


def is_pinned(capture: CaptureOptions) -> bool:
    """Whether a run's model names a fixed commit: a 40-hex revision, a local directory or the embedded model.

    A hub id at a branch or tag (``main`` when none is given) is floating: it can resolve to another commit
    tomorrow.
    """
    from qkplast.capture.models import DEFAULT_MODEL

    if capture.model == DEFAULT_MODEL or Path(capture.model).expanduser().exists():
        return True
    return bool(capture.revision and _COMMIT.fullmatch(capture.revision))


def _run_spec(i: int, entry, defaults: dict, base_resources: dict, out: Path) -> RunSpec:
    where = _entry_label(i, entry)
    _check_keys(where, entry, ENTRY_KEYS)
    if not entry.get("id"):
        raise StudyError(f"{where}: missing 'id' (a hub id, owner/name@revision, a local directory or smollm2-135m)")
    ident = str(entry["id"])
    merged = {**{k: v for k, v in defaults.items() if k != "analysis"},
              **{k: v for k, v in entry.items() if k in CAPTURE_FIELDS}}
    revision = split_revision(ident)[1] if not merged.get("model") else None
    if revision and merged.get("revision") not in (None, revision):
        raise StudyError(f"{where}: id names revision {revision!r} but 'revision' is {merged['revision']!r}; give one")
    merged.setdefault("model", ident)  # CaptureOptions splits owner/name@revision into model and revision
    try:
        capture = CaptureOptions(**merged)
    except (TypeError, ValueError, QkplastError) as exc:
        raise StudyError(f"{where}: {exc}") from None
    analysis = {**(defaults.get("analysis") or {}), **(entry.get("analysis") or {})}
    try:
        AnalysisOptions.from_kwargs(None, **analysis)
    except (TypeError, ValueError, QkplastError) as exc:
        raise StudyError(f"{where}: analysis: {exc}") from None
    name = str(entry.get("name") or slug(ident))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise StudyError(f"{where}: name {name!r} must be letters, digits, '.', '_' or '-' (it is a directory)")
    res = {**base_resources, **_resources(f"{where}: resources", entry.get("resources") or {})}
    return RunSpec(name, ident, capture, analysis, res, out / name)


def _check_floating(where: str, capture: CaptureOptions) -> None:
    if not is_pinned(capture):
        revision = capture.revision or "main"
        raise StudyError(f"{where}: revision {revision!r} of {capture.model} is a branch or tag, which can move; pin "
                         f"it as {capture.model}@<40-hex commit> (qkplast study FILE --validate prints the commit "
                         "it resolves to now) or set 'allow_floating: true' at the top of the study")


def parse_study(data: dict, source: Path, out: str | os.PathLike | None = None) -> Study:
    """Validate a study mapping; every problem is a :class:`StudyError` naming the entry."""
    if isinstance(data, dict) and "train" in data:
        raise StudyError(f"{source} is a training study (it has 'train:'); run it with: qkplast train {source}")
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
    allow_floating = data.get("allow_floating", False)
    if not isinstance(allow_floating, bool):
        raise StudyError(f"{source}: allow_floating must be true or false, got {allow_floating!r}")
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise StudyError(f"{source}: parameters must map notebook parameter names to values, got {parameters!r}")
    runs, seen = [], {}
    for i, entry in enumerate(data["models"]):
        spec = _run_spec(i, entry, defaults, resources, out)
        if not allow_floating:
            _check_floating(_entry_label(i, entry), spec.capture)
        if spec.name in seen:
            raise StudyError(f"{_entry_label(i, entry)}: duplicate name {spec.name!r} (also models[{seen[spec.name]}]);"
                             " give one of them a 'name'")
        seen[spec.name] = i
        runs.append(spec)
    return Study(str(data["name"]), out, source, tuple(runs), str(data.get("description", "")), resources, data,
                 allow_floating, dict(parameters))


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


def done_stage(run_dir: Path) -> str | None:
    """The furthest stage this run finished (its marker), or None."""
    marker = Path(run_dir) / DONE
    return json.loads(marker.read_text())["stage"] if marker.exists() else None


def is_done(run_dir: Path, stage: str) -> bool:
    finished = done_stage(run_dir)
    return finished is not None and STAGES.index(finished) >= STAGES.index(stage)


def run_dirs(study: Study, stage: str = "analyze") -> list[Path]:
    """Run directories of the study in study order that finished ``stage`` (or hold its result)."""
    need = {"capture": "capture.nc", "analyze": "metrics.nc", "notebooks": "metrics.nc"}[stage]
    return [r.run_dir for r in study.runs if is_done(r.run_dir, stage) or (r.run_dir / need).exists()]
