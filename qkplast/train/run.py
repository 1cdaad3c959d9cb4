"""Train every seed and arm of a :class:`TrainConfig` into a training directory, resumably.

``DIR/`` after :func:`train`::

    config.json        the config (a rerun with other weight-changing settings is refused)
    tokenizer/         the BPE (also inside every checkpoint)
    data/              the tokenized training and held-out documents (qkplast.train.data)
    hf/hub/            the checkpoints as branches (qkplast.train.hub); HF_HOME=DIR/hf
    state/             resume states of runs in progress, records of finished runs
    training.json      {"config": {...}, "device": "cpu"|"cuda", "gpu": name or null,
                        "runs": [{"seed", "arm", "rope_theta", "branches", "steps", "device", "gpu",
                                  "cpu_capability", "mkl_cbwr", "wall_s", "tokens_per_s"}]}

Stage A of each seed runs first; its extension arms start once it is done. Every run executes in a spawned
worker process (``workers`` of them at once) of ``threads`` threads, whose environment is set before torch is
imported there: on the CPU ATen's non-vectorised kernels and MKL's reproducible branch
(:data:`~qkplast.train.model.CPU_KERNEL_ENV`), so the weights are the same bits on any x86-64 CPU and for any
``workers``; on the GPU every worker uses the first GPU the parent sees (choose it with ``CUDA_VISIBLE_DEVICES``),
and the parent never makes a CUDA context. A rerun skips finished runs and resumes unfinished ones from their last
state, on the device they started on (another is refused).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from qkplast.resources import resource_dir
from qkplast.train.config import TrainConfig, TrainConfigError
from qkplast.train.data import prepare_data
from qkplast.train.loop import record_path, recorded_device, state_path, train_arm
from qkplast.train.model import CPU_KERNEL_ENV, training_device

__all__ = ["FULL_RUN", "STUDIES", "ensure_training", "expected_runs", "load_training", "train", "training_complete"]

TRAINING_JSON = "training.json"
#: The repository's study files (``studies/miniature.yaml`` is the book's default training).
STUDIES = resource_dir("studies")  # the checkout's studies/, or the copy a wheel ships
#: The committed full run of the miniature (``benchmarks/bench_miniature.py --export``) that chapter 10 reads:
#: the checkout's ``data/miniature-full/``, or the copy a wheel ships; found from the package, never from the
#: working directory of the process that reads it.
FULL_RUN = resource_dir("data/miniature-full")


def expected_runs(config: TrainConfig) -> list[tuple[int, str]]:
    """``(seed, arm)`` of every run, stage A first within a seed, in the order of ``training.json``."""
    return [(seed, arm) for seed in range(config.seeds) for arm in ("stageA", *config.arms)]


def train(config: TrainConfig, out, *, progress: bool = True) -> dict:
    """Train (or finish training) every run of ``config`` into ``out``; return the contents of ``training.json``.

    Raises
    ------
    TrainConfigError
        ``out`` holds a training with other weight-changing settings, or runs made on another device than
        ``config.device`` resolves to; another training holds its lock; ``cuda`` is requested without a GPU.
    """
    out = Path(out)
    device = training_device(config.device)  # before anything is written
    _claim(config, out)
    with _lock(out):
        runs = expected_runs(config)
        _check_device(out, runs, device)
        prepare_data(config, out, progress=progress)
        todo = [r for r in runs if not record_path(out, *r).exists()]
        with _bar(config, runs, todo, progress) as bar:
            if todo:
                _parallel(config, out, todo, bar, device)
        records = [json.loads(record_path(out, *r).read_text()) for r in runs]
        training = {"config": config.to_dict(), "device": records[0].get("device", "cpu"),
                    "gpu": records[0].get("gpu"), "runs": records}
        tmp = out / f".{TRAINING_JSON}.tmp"
        tmp.write_text(json.dumps(training, indent=1))
        os.replace(tmp, out / TRAINING_JSON)
    return training


def training_complete(out) -> bool:
    """Whether ``out/training.json`` exists and holds every run its config names."""
    path = Path(out) / TRAINING_JSON
    if not path.exists():
        return False
    training = json.loads(path.read_text())
    config = TrainConfig.from_kwargs(**training["config"])
    return [(r["seed"], r["arm"]) for r in training["runs"]] == expected_runs(config)


def load_training(out) -> tuple[TrainConfig, dict]:
    """The config and contents of a finished training directory."""
    path = Path(out) / TRAINING_JSON
    if not training_complete(out):
        raise TrainConfigError(f"{out} holds no finished training ({TRAINING_JSON} missing or incomplete); "
                               f"run qkplast train --out {out}")
    training = json.loads(path.read_text())
    return TrainConfig.from_kwargs(**training["config"]), training


def trained_tokens(out) -> int:
    """Tokens a finished training in ``out`` processed (all seeds and arms)."""
    config, _ = load_training(out)
    per_step = config.batch * config.window
    return config.seeds * per_step * (config.steps + len(config.arms) * config.ext_steps)


def ensure_training(spec: str, run_dir, *, progress: bool = True) -> tuple[TrainConfig, Path, dict]:
    """The training chapter 10 reads: ``(config, directory, training.json)``, trained first when missing.

    ``spec``
        ``""``: the finished training under ``RUN/training/`` with the most tokens (``miniature-full`` once it
        has run), else ``studies/miniature.yaml`` trained into ``RUN/training/miniature``; a preset name
        (``smoke``): that preset into ``RUN/training/<preset>``; a study file: its config into
        ``RUN/training/<name>``; a directory holding ``training.json``: that training as it is.
    """
    from qkplast.train.config import PRESETS, load_train_study

    root = Path(run_dir) / "training"
    if not spec:
        done = [d for d in sorted(root.glob("*")) if training_complete(d)]
        if done:
            out = max(done, key=trained_tokens)
            config, training = load_training(out)
            return config, out, training
        spec = str(STUDIES / "miniature.yaml")
    if spec in PRESETS:
        config, out = PRESETS[spec], root / spec
    elif Path(spec).is_dir():
        config, training = load_training(spec)
        return config, Path(spec), training
    else:
        study = load_train_study(spec)
        config, out = study.config, root / study.name
    if not training_complete(out):
        train(config, out, progress=progress)
    _claim(config, out)  # a finished training with other settings is an error, not silently read
    loaded, training = load_training(out)
    return loaded, out, training


def _check_device(out: Path, runs, device: str) -> None:
    """Refuse to continue a training whose runs (finished or in progress) were made on another device."""
    for seed, arm in runs:
        for path in (record_path(out, seed, arm), state_path(out, seed, arm)):
            if path.exists() and (was := recorded_device(path)) != device:
                raise TrainConfigError(f"{out} holds runs trained on {was} (seed {seed} {arm}) and this training "
                                       f"resolves to {device}; pass --device {was} or choose another --out")


def _claim(config: TrainConfig, out: Path) -> None:
    """Record ``config`` in ``out/config.json``, or check it against the one recorded (execution fields aside)."""
    path = out / "config.json"
    if path.exists():
        recorded = TrainConfig.from_kwargs(**json.loads(path.read_text()))
        differ = sorted(k for k, v in config.result_key().items() if recorded.result_key()[k] != v)
        if differ:
            raise TrainConfigError(f"{out} holds a training with other settings ({', '.join(differ)} differ); "
                                   "choose another --out or delete that directory")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config.to_dict(), indent=1))


class _lock:
    """An exclusive lock on ``out`` for the duration of a training (two trainings would corrupt each other)."""

    def __init__(self, out: Path):
        self.path = out / ".lock"

    def __enter__(self):
        import fcntl

        self.file = open(self.path, "w")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            raise TrainConfigError(f"another training is running in {self.path.parent}; wait for it or stop it") from None
        return self

    def __exit__(self, *exc):
        self.file.close()


def _bar(config: TrainConfig, runs, todo, progress: bool):
    """One bar over every token the training processes: tokens/s and ETA (a summary line off a terminal)."""
    from qkplast.progress import progress_bar

    def tokens(arm):
        return config.steps_of(arm) * config.batch * config.window

    total = sum(tokens(arm) for _, arm in runs)
    done = total - sum(tokens(arm) for _, arm in todo)
    return progress_bar(total=total, initial=done, unit="tok", unit_scale=True, desc="train", enabled=progress,
                        mininterval=1.0)


_REPORT = None  # in a worker process: the queue that carries progress to the parent's bar, and the parent's pid


def _init_worker(queue, parent: int) -> None:
    global _REPORT
    _REPORT = (queue, parent)


def worker_environment(config: TrainConfig, device: str) -> dict:
    """The variables a training worker process starts with (read by torch, OpenMP and MKL when they load)."""
    threads = str(config.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if device == "cpu":
        env.update(CPU_KERNEL_ENV)
    else:  # cuBLAS's deterministic mode needs a fixed workspace, set before its first handle
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        # one GPU per worker, the first the parent sees: a worker cannot make a context on any other
        env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return env


class _environment:
    """``os.environ`` with ``values`` inside the block (the spawned workers inherit it), restored after."""

    def __init__(self, values: dict):
        self.values = values

    def __enter__(self):
        self.before = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_worker_kernels(config: TrainConfig, device: str) -> dict:
    """The CPU kernel settings of this process (:func:`~qkplast.train.model.cpu_kernels`); raise unless a CPU
    worker runs the reproducible ones (a worker started some other way would train other bits)."""
    from qkplast.train.model import cpu_kernels

    kernels = cpu_kernels()
    if device == "cpu":
        wanted = {"cpu_capability": "DEFAULT", "mkl_cbwr": "COMPATIBLE" if kernels["mkl_cbwr"] else None}
        if kernels != wanted:
            raise RuntimeError(f"training worker runs CPU kernels {kernels}, not {wanted}: its environment was not "
                               f"set before torch was imported ({worker_environment(config, device)})")
    return kernels


def _report(tokens: int) -> None:
    """Progress from a worker process; a worker whose parent died stops (a resumed training may be running)."""
    queue, parent = _REPORT
    if os.getppid() != parent:
        os._exit(1)
    queue.put(tokens)


def _train_in_worker(config: TrainConfig, out: Path, seed: int, arm: str, device: str) -> None:
    check_worker_kernels(config, device)
    train_arm(config, out, seed, arm, report=_report, device=device)


def _parallel(config: TrainConfig, out: Path, todo, bar, device: str) -> None:
    """Runs on ``config.workers`` spawned processes (also for one: the kernels are set in the worker's
    environment before it imports torch); an arm is submitted once its seed's stage A is done."""
    import multiprocessing
    import queue as queues
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's threads
    updates = context.Queue()
    # the pool starts its processes on submit, inside this block: they inherit the environment set here
    with _environment(worker_environment(config, device)), ProcessPoolExecutor(
            min(config.workers, len(todo)), mp_context=context, initializer=_init_worker,
            initargs=(updates, os.getpid())) as pool:
        waiting = [r for r in todo if r[1] != "stageA" and (r[0], "stageA") in todo]
        pending = {pool.submit(_train_in_worker, config, out, *r, device): r for r in todo if r not in waiting}
        while pending:
            finished, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            while True:
                try:
                    bar.update(updates.get_nowait())
                except queues.Empty:
                    break
            for future in finished:
                seed, arm = pending.pop(future)
                future.result()  # a failed run stops the training with its error
                for r in [r for r in waiting if arm == "stageA" and r[0] == seed]:
                    waiting.remove(r)
                    pending[pool.submit(_train_in_worker, config, out, *r, device)] = r
