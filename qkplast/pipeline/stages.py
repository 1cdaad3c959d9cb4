"""``qkplast run``: capture, analyse and execute every notebook for one capture setting, in three stages.

:func:`run` reads top to bottom: open the run directory and its manifest, then :func:`capture_stage`
(every capture the notebooks read, one model load per model, released before anything else),
:func:`analyze_stage` (metrics and the document bootstrap of each capture) and :func:`notebook_stage`
(papermill, ``jobs`` kernels at once). It stops after ``stage``; a rerun reuses every finished
capture, analysis and notebook (see :mod:`qkplast.rundir.products`).
"""

from __future__ import annotations

import gc
import hashlib
import platform
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from qkplast.tensors import release_gpu_memory
from qkplast._version import package_versions
from qkplast.capture.plan import CapturePlan, CodeCapture
from qkplast.errors import QkplastError
from qkplast.capture_format import open_capture, open_dataset
from qkplast.options import AnalysisOptions, CaptureOptions
from qkplast.pipeline.params import declared_parameters, notebook_paths
from qkplast.progress import is_terminal
from qkplast.provenance import source_digest
from qkplast.rundir.products import (CODE_DIR, STAGES, RunError, check_same_capture, checkpoint_dir,
                                      checkpoint_options, checkpoint_slug, clear_leftover_parts, ensure_capture,
                                      load_or_analyze, load_or_bootstrap,
                                      read_manifest, run_settings, write_manifest)

__all__ = ["CODE_CORPUS", "RunResult", "Target", "analyze_stage", "capture_stage", "check_before_weights",
           "check_memory", "check_windows", "code_capture", "notebook_stage", "run"]

#: Corpus of the code capture that notebook 09 sets beside the prose (its ``code_corpus`` parameter).
CODE_CORPUS = "stdlib-code"
#: the default run's slowest notebooks, slowest first; with jobs > 1 they start first and the others run beside them
SLOW_FIRST = ("12_interventions", "10_results_training", "13_open_questions", "07_corrections")


@dataclass
class RunResult:
    run_dir: Path
    manifest: dict


def _default_out(capture: CaptureOptions) -> Path:
    return Path("runs") / checkpoint_slug(capture.model + (f"@{capture.revision}" if capture.revision else ""))


class Target(NamedTuple):
    """One capture of a run: where it lives, its settings, and whether the run goes on without it."""

    run_dir: Path
    options: CaptureOptions
    optional: bool = False  # the code capture: its failure is recorded in the manifest, never raised


def code_capture(out: Path, capture: CaptureOptions, parameters: dict, previous: dict, tokenizer=None) -> CodeCapture:
    """The code capture of notebook 09, sized to what its corpus yields (:func:`qkplast.capture.plan.size_code_capture`).

    A rerun reuses the sizing its manifest recorded for the same corpus and capture settings (no tokenizing).
    ``tokenizer``: the run's, when its preflight loaded it (otherwise loaded here).
    """
    from qkplast.capture.models import quiet_transformers
    from qkplast.capture.plan import size_code_capture

    corpus = parameters.get("code_corpus", CODE_CORPUS)
    record = previous.get("code") or {}
    if record.get("corpus") == corpus and record.get("main") == capture.result_key() and record.get("status") != "failed":
        return CodeCapture.from_dict(record)
    with quiet_transformers():
        return size_code_capture(capture, corpus, tokenizer=tokenizer)


def _targets(out: Path, capture: CaptureOptions, parameters: dict, code: CodeCapture) -> list[Target]:
    """Every capture the notebooks read: the run's own, the code corpus's (notebook 09, optional and sized) and
    the checkpoints' (notebook 10, in ``RUN/checkpoints/<slug>`` as :func:`qkplast.rundir.checkpoint_metrics`
    reads them)."""
    targets = [Target(out, capture)]
    if code.options is not None:
        targets.append(Target(out / CODE_DIR, code.options, optional=True))
    for ckpt in parameters.get("checkpoints") or []:
        targets.append(Target(checkpoint_dir(out, ckpt), checkpoint_options(capture, ckpt)))
    return targets


def check_windows(options: CaptureOptions, **shared) -> CapturePlan:
    """The preflight of one capture (:func:`qkplast.capture.plan.preflight`): everything checkable without weights
    (config, window, device, kernel, and the corpus filling the windows), in seconds, raising at the first problem.

    ``shared``: ``tokenizer=``, the run's tokenizer when another capture of the run loaded it already;
    ``memory=False``, no memory plan.
    """
    from qkplast.capture.models import quiet_transformers
    from qkplast.capture.plan import preflight

    with quiet_transformers():
        return preflight(options, **shared)


def check_memory(plan: CapturePlan, device_memory_gb: float | None = None) -> None:
    """Refuse a capture whose planned peak memory exceeds the device (``device_memory_gb``: default the plan's)."""
    from qkplast.capture.plan import PlanError

    if device_memory_gb is not None:
        plan = replace(plan, device_memory_gb=device_memory_gb)
    problem = plan.memory_problem()
    if problem:
        raise PlanError(f"{problem}; or pass --no-memory-check to try anyway")


def check_before_weights(target: Target, memory_check: bool = True, device_memory_gb: float | None = None, *,
                         tokenizer=None, settings_checked: bool = False) -> CapturePlan | None:
    """Every check of one capture that needs no weights, each once: same settings as a capture already there
    (unless ``settings_checked``: the caller just did), and, when it is still to be made, its preflight
    (:func:`check_windows`) and (unless ``memory_check`` is False) the memory the preflight planned.

    Returns the preflight, for :func:`qkplast.rundir.products.ensure_capture` (None when the capture exists).
    """
    if not settings_checked:
        check_same_capture(target.run_dir, target.options)
    if (target.run_dir / "capture.nc").exists():
        return None
    # only what differs from a preflight's defaults: the tokenizer when there is one to share, no memory plan
    # (no model built on the meta device) when memory is not checked
    shared = {**({} if tokenizer is None else {"tokenizer": tokenizer}), **({} if memory_check else {"memory": False})}
    plan = check_windows(target.options, **shared)
    if memory_check:
        check_memory(plan, device_memory_gb)
    return plan


def capture_stage(targets, analysis: AnalysisOptions, progress, skipped: dict | None = None, *,
                  memory_check: bool = True, device_memory_gb: float | None = None, checked=None,
                  tokenizer=None) -> int:
    """Every missing capture, one load per model (released before the next and before returning).

    The corpora and (unless ``memory_check`` is False) the planned peak memory are checked (config and
    tokenizer only) before any weights load (:func:`check_before_weights`), once per capture: ``checked`` maps
    run directories already checked to their preflight (None when nothing is left to capture there), and
    each preflight is passed whole to the capture. ``tokenizer``: the run's, shared by the preflights. An
    optional target (the code capture) that fails is left out and its error recorded in ``skipped`` (run
    directory -> message); any other failure is raised. Returns the number of model loads.
    """
    from qkplast.capture.models import load_for, release_model

    skipped = {} if skipped is None else skipped

    def attempt(target, action):
        if not target.optional:
            return action()
        try:
            return action()
        except QkplastError as exc:
            skipped[target.run_dir] = f"the code capture failed and is left out ({exc})"
            print(f"[qkplast run] {skipped[target.run_dir]}", file=sys.stderr, flush=True)

    plans = dict(checked or {})
    for target in targets:
        if target.run_dir not in plans:
            plans[target.run_dir] = attempt(target, lambda: check_before_weights(
                target, memory_check, device_memory_gb, tokenizer=tokenizer))
    missing = [t for t in targets if t.run_dir not in skipped and not (t.run_dir / "capture.nc").exists()]
    for target in targets:  # made by an earlier attempt, which may have been killed before clearing its parts
        if target not in missing:
            clear_leftover_parts(target.run_dir)
    models = list(dict.fromkeys((t.options.model, t.options.revision) for t in missing))
    for model in models:
        group = [t for t in missing if (t.options.model, t.options.revision) == model]
        loaded = load_for(group[0].options, plan=plans.get(group[0].run_dir))
        try:
            for target in group:
                if progress:
                    print(f"[qkplast run] capture: {target.options.corpus}, {target.options.docs} windows of "
                          f"{target.options.seq_len} tokens -> {target.run_dir / 'capture.nc'}", file=sys.stderr,
                          flush=True)
                attempt(target, lambda: ensure_capture(target.run_dir, target.options, analysis, loaded=loaded,
                                                       progress=progress, plan=plans.get(target.run_dir)))
        finally:
            release_model(loaded)
            loaded = None  # the last reference, so that the collection below frees the weights
            gc.collect()
    return len(models)


def analyze_stage(targets, analysis: AnalysisOptions, n_boot: int | None, timings: dict | None = None) -> None:
    """Metrics of every capture and, with ``n_boot``, its document bootstrap.

    The notebooks' bootstrap (07 and 08 on the run, 09 on the code) is made once here: two notebooks running
    at once (``jobs > 1``) would each compute it.
    """
    timings = {} if timings is None else timings
    for run_dir, _, optional in targets:
        if optional and not (run_dir / "capture.nc").exists():
            continue  # a code capture that was left out
        captured = open_capture(run_dir / "capture.nc")
        label = "run" if run_dir == targets[0].run_dir else run_dir.name  # the run, code, or a checkpoint
        t0 = time.perf_counter()
        load_or_analyze(run_dir, captured, analysis)
        timings[f"analyze:{label}"] = round(time.perf_counter() - t0, 2)
        if n_boot and len(set(captured.doc.values.tolist())) >= 2:
            t0 = time.perf_counter()
            load_or_bootstrap(run_dir, captured, analysis, n_boot)
            timings[f"bootstrap:{label}"] = round(time.perf_counter() - t0, 2)


def _notebook_digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()[:16]


def _kernel_config():
    """The traitlets config of the kernels that execute the notebooks: CurveZMQ-encrypted transport.

    ipykernel (7.x) warns "Kernel is running over TCP without encryption" on the log of every notebook it runs
    when its kernel manager provisions no keys. ``transport_encryption = "auto"`` has jupyter_client generate a
    CurveZMQ key pair per kernel whenever the kernelspec declares support (ipykernel's does), so the
    connection is encrypted and the warning is not printed. TCP is kept (rather than the IPC transport, which
    would also silence it): IPC's socket files land in the working directory papermill moves to, where two
    kernels started at once (``--jobs 2``) could race for the same names. A pyzmq built without CurveZMQ
    keeps the default (unencrypted, with the warning).
    """
    import zmq
    from traitlets.config import Config

    config = Config()
    if zmq.has("curve"):
        config.KernelManager.transport_encryption = "auto"
    return config


def _log_line(text: str) -> None:
    """One line to stderr in a single write: with ``jobs > 1`` the notebooks' threads log at once, and ``print``
    writes the text and its newline separately, so two labels could share a line in the log."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _execute_notebook(path: Path, target: Path, nb_params: dict, progress_bar: bool, label: str | None) -> dict:
    """Execute one notebook with papermill; its manifest entry (status, seconds or the failing cell).

    The kernel starts in the notebook's folder through nbclient's ``resources`` (the kernel process gets it as
    its own working directory), never through papermill's ``cwd=``: that one is an ``os.chdir`` of the whole
    process, and papermill also changes the process's directory around every autosave of an output notebook.
    With two notebooks at once (``jobs > 1``) a kernel launched by one thread while the other thread was inside
    such a change started in the wrong folder: the book's chapter 10 then missed ``data/miniature-full`` and
    trained the preview (``tests/integration/pipeline/test_stages_notebooks.py`` holds the process's directory
    moving during a run).
    """
    import papermill as pm

    if label:
        _log_line(label)
    t0 = time.perf_counter()
    try:
        # papermill's bar over cells only on a terminal: in a log file its redraws would be one line each
        pm.execute_notebook(str(path), str(target), parameters=nb_params,
                            resources={"metadata": {"path": str(path.parent)}},
                            progress_bar=progress_bar and is_terminal(), kernel_name="python3",
                            config=_kernel_config())
    except pm.PapermillExecutionError as exc:
        return {"name": path.name, "status": "failed", "cell": exc.exec_count, "error": f"{exc.ename}: {exc.evalue}"}
    seconds = round(time.perf_counter() - t0, 2)
    if label:
        _log_line(f"{label} done in {seconds:.0f} s")
    return {"name": path.name, "status": "ok", "seconds": seconds, "source": _notebook_digest(path),
            "parameters": nb_params, "qkplast_sha256": source_digest()}


def _notebooks_to_run(out: Path, manifest: dict, paths: list[Path], parameters: dict):
    """Manifest entries of notebooks already executed with this source, these parameters and this qkplast code
    (:func:`qkplast.provenance.source_digest`: a change of the package executes them again), and the rest."""
    nb_out = out / "notebooks"
    done = {e["name"]: e for e in manifest["notebooks"] if e.get("status") == "ok"}
    entries, todo = {}, []
    for i, path in enumerate(paths, 1):
        # each notebook gets the parameters it declares (papermill warns about the others)
        declared = declared_parameters(path)
        nb_params = {**{k: v for k, v in parameters.items() if k in declared}, "run_dir": str(out)}
        entry = done.get(path.name)
        if entry and entry.get("source") == _notebook_digest(path) and entry.get("parameters") == nb_params \
                and entry.get("qkplast_sha256") == source_digest() and (nb_out / path.name).exists():
            entries[path.name] = entry
        else:
            todo.append((i, path, nb_params))
    return entries, todo


def notebook_stage(out: Path, manifest: dict, parameters: dict, paths: list[Path], *, jobs: int = 1,
                   progress: bool = True) -> None:
    """Execute the notebooks not yet executed with this source and these parameters, ``jobs`` at once.

    The manifest records each notebook as it finishes; the first failure cancels the notebooks not yet
    started and is raised naming the notebook, the cell and the error.
    """
    nb_out = out / "notebooks"
    nb_out.mkdir(exist_ok=True)
    entries, todo = _notebooks_to_run(out, manifest, paths, parameters)

    def record():
        manifest["notebooks"] = [entries[p.name] for p in paths if p.name in entries]
        write_manifest(out, manifest)

    label = lambda i, path: f"[qkplast run] notebook {i}/{len(paths)}: {path.name}"  # noqa: E731
    if jobs > 1:  # the longest first, so that the short ones fill in beside them at the end
        todo.sort(key=lambda item: SLOW_FIRST.index(item[1].stem) if item[1].stem in SLOW_FIRST else len(SLOW_FIRST))
    failure = None
    with ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        futures = {pool.submit(_execute_notebook, path, nb_out / path.name, nb_params, progress is True and jobs == 1,
                               label(i, path) if progress else None): path for i, path, nb_params in todo}
        for future in as_completed(futures):
            if future.cancelled():  # not started after an earlier failure
                continue
            path = futures[future]
            entries[path.name] = entry = future.result()
            if entry["status"] == "ok":
                manifest["timings_s"][path.stem] = entry["seconds"]
            elif failure is None:
                failure = entry
                manifest["status"] = "failed"
                for other in futures:
                    other.cancel()  # notebooks not yet started are not run
            record()
    if failure is not None:
        raise RunError(f"notebook {failure['name']} failed in cell {failure['cell']}: {failure['error']} "
                       f"(executed copy with the traceback: {nb_out / failure['name']})")
    record()


def _open(out, capture: CaptureOptions | None, analysis: AnalysisOptions | None, overwrite: bool):
    """The run directory (absolute), its capture and analysis options and the manifest before this run."""
    # absolute: papermill changes the process's working directory while it runs a notebook, and with jobs > 1
    # this thread writes the manifest meanwhile
    out = Path(out or _default_out(capture or CaptureOptions())).resolve()
    if out.exists() and overwrite:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    recorded_capture, recorded_analysis = run_settings(out)
    capture = capture or recorded_capture
    check_same_capture(out, capture)
    previous = read_manifest(out) or {}
    analysis = analysis or (recorded_analysis if previous.get("analysis") else AnalysisOptions(seed=capture.seed))
    if previous.get("analysis") and AnalysisOptions(**previous["analysis"]).result_key() != analysis.result_key():
        raise RunError(f"{out} was analysed with other options; use another run directory (--out) or --overwrite")
    return out, capture, analysis, previous


def _timed(manifest: dict, name: str, t0: float) -> None:
    manifest["timings_s"][name] = round(time.perf_counter() - t0, 2)


def run(capture: CaptureOptions | None = None, out=None, *, analysis: AnalysisOptions | None = None,
        parameters: dict | None = None, stage: str = "notebooks", overwrite: bool = False, progress: bool = True,
        notebooks: list[Path] | None = None, jobs: int = 1, memory_check: bool = True,
        device_memory_gb: float | None = None) -> RunResult:
    """Capture, analyse and execute every notebook for one capture setting; write a manifest.

    Parameters
    ----------
    capture : CaptureOptions, optional
        The capture settings (default: those of an existing run directory, else
        the :class:`CaptureOptions` defaults).
    out : path, optional
        Run directory (default ``runs/<model>``).
    analysis : AnalysisOptions, optional
        Analysis options of the run (default: those of an existing run directory,
        else the thesis defaults with the capture's seed).
    parameters : dict, optional
        Notebook parameters (``n_boot``, ``code_corpus``, ...), passed to every notebook.
    stage : {"capture", "analyze", "notebooks"}
        Stop after this stage.
    overwrite : bool
        Delete an existing run directory first; otherwise a rerun reuses what is
        finished (captures, analyses, notebooks whose source and parameters did
        not change) and refuses other capture or analysis settings.
    progress : bool or "lines"
        Progress per document (with ETA) during the captures, per cell in the notebooks; ``"lines"``: plain
        lines instead of bars (window k of n, seconds per window, ETA; one line per notebook), for log files.
    notebooks : list of Path, optional
        Notebooks to execute (default: every ``notebooks/NN_*.ipynb``).
    memory_check : bool
        Refuse, before any weights load, a capture whose planned peak memory exceeds the device
        (:meth:`qkplast.capture.plan.CapturePlan.memory_problem`); False tries anyway.
    device_memory_gb : float, optional
        Memory of the device (one GPU) the plan is checked against (default: detected).
    jobs : int
        Notebooks executed at once, each in its own kernel (default 1). On a
        CPU machine 2 overlaps the single-threaded parts of one notebook
        (kernel start, imports, tables, figures) with another's work; the book
        build uses it. Keep 1 where a notebook loads a large model (chapter 12
        loads the run's model for its interventions): two kernels would hold two
        copies on the GPU.

    Raises
    ------
    RunError
        A failing notebook (naming it, the cell and the error; the manifest records
        the failure) or a run directory made with other settings.
    """
    from qkplast.stats.bootstrap import DEFAULT_REPLICATES

    if stage not in STAGES:
        raise RunError(f"stage must be one of {STAGES}, got {stage!r}")
    out, capture, analysis, previous = _open(out, capture, analysis, overwrite)
    parameters = dict(parameters or {})
    manifest = {"capture": capture.to_dict(), "analysis": analysis.to_dict(), "parameters": parameters,
                "versions": {"python": platform.python_version(),
                             **package_versions(("qkplast", "torch", "transformers", "numpy", "scipy", "xarray",
                                                 "papermill"))}, "command": sys.argv, "commit": previous.get("commit"),
                "timings_s": dict(previous.get("timings_s", {})), "notebooks": list(previous.get("notebooks", [])),
                "stage": stage, "status": "running"}
    if capture.device.startswith("cuda"):
        import torch

        manifest["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    write_manifest(out, {**previous, **manifest})
    # the run's own first, in seconds (its settings were checked when the directory was opened)
    plan = check_before_weights(Target(out, capture), memory_check, device_memory_gb, settings_checked=True)
    tokenizer = None if plan is None else plan.tokenizer
    code = code_capture(out, capture, parameters, previous, tokenizer)
    manifest["code"] = {"corpus": parameters.get("code_corpus", CODE_CORPUS), "main": capture.result_key(),
                        **code.to_dict()}
    if progress:
        print(f"[qkplast run] {code.note}", file=sys.stderr, flush=True)
    write_manifest(out, {**previous, **manifest})
    targets = _targets(out, capture, parameters, code)

    t0 = time.perf_counter()
    skipped = {}
    capture_stage(targets, analysis, progress, skipped, memory_check=memory_check, device_memory_gb=device_memory_gb,
                  checked={out: plan}, tokenizer=tokenizer)
    _timed(manifest, "capture", t0)
    if out / CODE_DIR in skipped:
        manifest["code"].update(status="failed", note=skipped[out / CODE_DIR])
    manifest["commit"] = open_dataset(out / "capture.nc").attrs.get("commit")
    write_manifest(out, manifest)
    if stage == "capture":
        return _finish(out, manifest)

    t0 = time.perf_counter()
    n_boot = int(parameters.get("n_boot", DEFAULT_REPLICATES)) if stage == "notebooks" else None
    analyze_stage(targets, analysis, n_boot, manifest["timings_s"])
    _timed(manifest, "analyze", t0)
    release_gpu_memory()  # the analyses' cached GPU blocks, before a notebook kernel loads the model
    write_manifest(out, manifest)
    if stage == "analyze":
        return _finish(out, manifest)

    paths = [Path(p).resolve() for p in (notebooks or notebook_paths())]
    notebook_stage(out, manifest, parameters, paths, jobs=jobs, progress=progress)
    return _finish(out, manifest)


def _finish(out: Path, manifest: dict) -> RunResult:
    manifest["status"] = "ok"
    write_manifest(out, manifest)
    return RunResult(out, manifest)
