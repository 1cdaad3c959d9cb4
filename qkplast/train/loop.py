"""One training run: stage A from a seed, or one extension arm from a stage-A checkpoint (``ext_from``).

The loop is plain torch: AdamW (on the CPU with a correctly rounded root, :mod:`qkplast.train.optim`), a cosine
or warmup-stable-decay schedule with warm-up, gradient clipping, deterministic kernels on a fixed number of
threads, on the CPU or (bf16 autocast) the GPU. Every checkpoint of
the run's schedule becomes a branch of the seed's hub repository (:mod:`qkplast.train.hub`); the model, optimiser
and random-number states go to ``DIR/state/`` at every checkpoint and every ``resume_every`` steps, so a killed
run resumes from its last state to the same weights. With ``ext_from: predecay`` stage A also keeps AdamW's
state at the start of its decay (``DIR/state/seed{S}-predecay.pt``), where the arms continue from.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qkplast.train.config import TrainConfig, TrainConfigError
from qkplast.train.data import TokenData, batch_windows, copy_batch, load_data, with_bos
from qkplast.train.hub import branch_name, hub_cache, publish, repo_id, snapshot
from qkplast.train.model import build_model, cpu_kernels, deterministic, lr_at, training_device
from qkplast.train.optim import adamw_step
from qkplast.train.tokenizer import checkpoint_tokenizer

__all__ = ["predecay_path", "record_path", "recorded_device", "state_path", "train_arm"]


def state_path(out, seed: int, arm: str) -> Path:
    """Resume state of a run in progress (removed when the run is done)."""
    return Path(out) / "state" / f"seed{seed}-{arm}.pt"


def record_path(out, seed: int, arm: str) -> Path:
    """The record of a finished run: its entry of ``training.json``."""
    return Path(out) / "state" / f"seed{seed}-{arm}.json"


def predecay_path(out, seed: int) -> Path:
    """AdamW's state of stage A at the start of its decay (``ext_from: predecay``), kept for the arms."""
    return Path(out) / "state" / f"seed{seed}-predecay.pt"


def recorded_device(path: Path) -> str:
    """The device a run's record (``.json``) or resume state (``.pt``) was trained on (``cpu`` before the field)."""
    if path.suffix == ".json":
        return json.loads(path.read_text()).get("device", "cpu")
    import torch

    return torch.load(path, map_location="cpu", weights_only=False).get("device", "cpu")


@dataclass
class Run:
    """A run in progress: what a resume state holds."""

    model: object
    optimizer: object
    device: str = "cpu"
    step: int = 0
    log: list = field(default_factory=list)
    branches: dict = field(default_factory=dict)
    wall_s: float = 0.0  # seconds of this run's loop, over every session (a resumed run adds its own)
    timed_steps: int = 0  # the steps those seconds cover


def train_arm(config: TrainConfig, out, seed: int, arm: str, report=None, device: str | None = None) -> dict:
    """Train ``arm`` (``"stageA"`` or an extension arm) of ``seed`` to its last step; return its record.

    ``report(tokens)`` is called after every step (the progress bar). A finished run returns its record at once.
    ``device`` is the resolved device (``cpu`` or ``cuda``; None: resolve ``config.device`` here).

    Raises
    ------
    TrainConfigError
        The run's resume state was made on another device than ``device``.
    """
    out = Path(out)
    if record_path(out, seed, arm).exists():
        return json.loads(record_path(out, seed, arm).read_text())
    device = device or training_device(config.device)
    data = load_data(out)
    total, checkpoints = config.steps_of(arm), set(config.checkpoint_steps(arm))
    peak, warmup = (config.lr, config.warmup) if arm == "stageA" else (config.ext_lr, config.ext_warmup)
    with deterministic(config.threads, device):
        import torch

        run = _resume(config, out, seed, arm, data, device)
        # bf16 autocast on the GPU: the forward pass and the loss; weights, gradients and AdamW stay float32
        autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")
        tic = last = time.perf_counter()
        tokens_since = 0
        while True:
            if run.step in checkpoints and branch_name(arm, run.step) not in run.branches:
                run.branches[branch_name(arm, run.step)] = run.step
                _publish(run.model, out, seed, arm, run.step, config.bos)
                if arm == "stageA" and config.ext_from == "predecay" and run.step == config.ext_start:
                    _save_predecay(run, out, seed)
                _save_state(run, out, seed, arm)
            if run.step == total:
                break
            x = torch.from_numpy(_batch(config, arm, data, seed, run.step)).to(device)  # [batch, window]
            for group in run.optimizer.param_groups:
                group["lr"] = lr_at(run.step, peak, warmup, total, config.min_lr_ratio, config.schedule,
                                    config.decay_share)
            with autocast:
                loss = run.model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), config.grad_clip)
            if device == "cpu":  # torch's root of AdamW's second moment has CPU-specific bits; this one does not
                adamw_step(run.optimizer)
            else:
                run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
            run.step += 1
            tokens_since += x.numel()
            if run.step % config.log_every == 0 or run.step == total:
                value = loss.item()  # on the GPU: waits for the step, so the time below is the step's
                elapsed = time.perf_counter() - tic
                run.log.append({"step": run.step, "loss": value, "tokens_per_s": tokens_since / elapsed})
                tic, tokens_since = time.perf_counter(), 0
            if report is not None:
                report(x.numel())
            now = time.perf_counter()
            run.wall_s, run.timed_steps, last = run.wall_s + now - last, run.timed_steps + 1, now
            if run.step % config.resume_every == 0:
                _save_state(run, out, seed, arm)
    record = {"seed": seed, "arm": arm, "rope_theta": config.theta_of(arm), "branches": run.branches,
              "steps": run.log, **_execution(run, config)}
    _write_json(record_path(out, seed, arm), record)
    state_path(out, seed, arm).unlink(missing_ok=True)
    return record


def _execution(run: Run, config: TrainConfig) -> dict:
    """Where and how fast a run trained: device, GPU name, CPU kernels, wall time (every session's loop: steps,
    checkpoints and resume states) and the mean tokens/s over it."""
    import torch

    gpu = torch.cuda.get_device_name(torch.cuda.current_device()) if run.device == "cuda" else None
    tokens = run.timed_steps * config.batch * config.window  # every arm keeps stage A's tokens per step
    return {"device": run.device, "gpu": gpu, **cpu_kernels(), "wall_s": run.wall_s,
            "tokens_per_s": tokens / run.wall_s if run.wall_s > 0 else None}


def _batch(config: TrainConfig, arm: str, data: TokenData, seed: int, step: int) -> np.ndarray:
    """Token ids ``[batch, window]`` of ``step``: packed stage-A windows, or single-document extension windows.

    Every extension arm reads the same long windows at the same step (stream 1 of the seed); the short arm
    cuts each into ``ext_factor`` windows, so the arms see the same tokens and differ only in window and base.
    """
    if arm == "stageA":
        windows = data.windows(config.window)
        rows = np.asarray(windows[batch_windows(len(windows), config.batch, step, seed, 0)], np.int64)
        return with_bos(copy_batch(config, rows, seed, step, "stageA", data.eot), config.bos, data.eot)
    rows = batch_windows(len(data.chunks), config.batch // config.ext_factor, step, seed, 1)
    chunks = np.asarray(data.chunks[rows], np.int64)  # [batch / ext_factor, ext_window]
    # copied spans in the long windows, before the short arm cuts them: every arm still sees the same tokens
    cut = copy_batch(config, chunks, seed, step, "extension", data.eot).reshape(-1, config.window_of(arm))
    return with_bos(cut, config.bos, data.eot)  # [batch, window of the arm]: each of the short arm's windows too


def _optimizer(model, config: TrainConfig, peak: float):
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]  # norm gains: no weight decay
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=peak, betas=(0.9, config.beta2), eps=1e-8)


def _resume(config: TrainConfig, out: Path, seed: int, arm: str, data: TokenData, device: str) -> Run:
    """The run from its resume state, or fresh: stage A from ``seed``, an arm from the stage-A branch at
    ``config.ext_start`` (with ``predecay``, and AdamW's state of that step)."""
    import torch

    peak = config.lr if arm == "stageA" else config.ext_lr
    path = state_path(out, seed, arm)
    state = torch.load(path, map_location=device, weights_only=False) if path.exists() else None
    if state is not None and state.get("device", "cpu") != device:
        raise TrainConfigError(f"run seed {seed} {arm} in {out} started on {state.get('device', 'cpu')} and would "
                               f"resume on {device}; pass --device {state.get('device', 'cpu')} or choose another --out")
    if arm == "stageA":
        model = build_model(config, arm, data.eot, seed=seed)  # initialised on the CPU: the same on every device
    else:
        from transformers import LlamaForCausalLM

        from qkplast.train.model import llama_config

        start = snapshot(hub_cache(out), repo_id(seed), branch_name("stageA", config.ext_start))
        model = LlamaForCausalLM.from_pretrained(start, config=llama_config(config, arm, data.eot), dtype=torch.float32)
    model.to(device).train()
    run = Run(model, _optimizer(model, config, peak), device)
    if state is not None:
        run.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"].cpu())
        if device == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"].cpu())
        run.step, run.log, run.branches = state["step"], state["log"], state["branches"]
        run.wall_s, run.timed_steps = state.get("wall_s", 0.0), state.get("timed_steps", 0)
    elif arm != "stageA" and config.ext_from == "predecay":
        # the arms continue stage A's optimiser: its moments and step count, so no re-warming is needed
        saved = torch.load(predecay_path(out, seed), map_location=device, weights_only=False)
        run.optimizer.load_state_dict(saved["optimizer"])
    return run


def _save_state(run: Run, out: Path, seed: int, arm: str) -> None:
    import torch

    state = {"step": run.step, "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
             "rng": torch.get_rng_state(), "log": run.log, "branches": run.branches, "device": run.device,
             "wall_s": run.wall_s, "timed_steps": run.timed_steps}
    if run.device == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state()
    _torch_save(state, state_path(out, seed, arm))


def _save_predecay(run: Run, out: Path, seed: int) -> None:
    """AdamW's state of stage A at the start of its decay, with its step and device, for the arms."""
    _torch_save({"step": run.step, "optimizer": run.optimizer.state_dict(), "device": run.device},
                predecay_path(out, seed))


def _torch_save(value, path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(value, tmp)
    os.replace(tmp, path)


def _publish(model, out: Path, seed: int, arm: str, step: int, bos: bool = False) -> str:
    """Save the model with the training's tokenizer (with ``bos``, one that puts ``<|endoftext|>`` in front of a
    text, as the model was trained) and add it to the hub cache as the checkpoint's branch."""
    tokenizer = checkpoint_tokenizer(out / "tokenizer", bos)
    (out / "hf").mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=out / "hf", prefix=".checkpoint-"))
    try:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return publish(folder, hub_cache(out), repo_id(seed), branch_name(arm, step))
    finally:
        shutil.rmtree(folder)


def _write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)
