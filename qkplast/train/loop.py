"""One training run: stage A from a seed, or one extension arm from the final stage-A checkpoint.

The loop is plain torch: AdamW, a cosine schedule with warm-up, gradient clipping, deterministic kernels on a
fixed number of threads. Every checkpoint of the run's schedule becomes a branch of the seed's hub repository
(:mod:`qkplast.train.hub`); the model, optimiser and random-number states go to ``DIR/state/`` at every
checkpoint and every ``resume_every`` steps, so a killed run resumes from its last state to the same weights.
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

from qkplast.train.config import TrainConfig
from qkplast.train.data import TokenData, batch_windows, load_data
from qkplast.train.hub import branch_name, hub_cache, publish, repo_id, snapshot
from qkplast.train.model import build_model, deterministic, lr_at

__all__ = ["record_path", "state_path", "train_arm"]


def state_path(out, seed: int, arm: str) -> Path:
    """Resume state of a run in progress (removed when the run is done)."""
    return Path(out) / "state" / f"seed{seed}-{arm}.pt"


def record_path(out, seed: int, arm: str) -> Path:
    """The record of a finished run: its entry of ``training.json``."""
    return Path(out) / "state" / f"seed{seed}-{arm}.json"


@dataclass
class Run:
    """A run in progress: what a resume state holds."""

    model: object
    optimizer: object
    step: int = 0
    log: list = field(default_factory=list)
    branches: dict = field(default_factory=dict)


def train_arm(config: TrainConfig, out, seed: int, arm: str, report=None) -> dict:
    """Train ``arm`` (``"stageA"`` or an extension arm) of ``seed`` to its last step; return its record.

    ``report(tokens)`` is called after every step (the progress bar). A finished run returns its record at once.
    """
    out = Path(out)
    if record_path(out, seed, arm).exists():
        return json.loads(record_path(out, seed, arm).read_text())
    data = load_data(out)
    total, checkpoints = config.steps_of(arm), set(config.checkpoint_steps(arm))
    peak, warmup = (config.lr, config.warmup) if arm == "stageA" else (config.ext_lr, config.ext_warmup)
    with deterministic(config.threads):
        import torch

        run = _resume(config, out, seed, arm, data)
        tic, tokens_since = time.perf_counter(), 0
        while True:
            if run.step in checkpoints and branch_name(arm, run.step) not in run.branches:
                run.branches[branch_name(arm, run.step)] = run.step
                _publish(run.model, out, seed, arm, run.step)
                _save_state(run, out, seed, arm)
            if run.step == total:
                break
            x = torch.from_numpy(_batch(config, arm, data, seed, run.step))  # [batch, window]
            for group in run.optimizer.param_groups:
                group["lr"] = lr_at(run.step, peak, warmup, total, config.min_lr_ratio)
            loss = run.model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), config.grad_clip)
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
            run.step += 1
            tokens_since += x.numel()
            if run.step % config.log_every == 0 or run.step == total:
                elapsed = time.perf_counter() - tic
                run.log.append({"step": run.step, "loss": loss.item(), "tokens_per_s": tokens_since / elapsed})
                tic, tokens_since = time.perf_counter(), 0
            if report is not None:
                report(x.numel())
            if run.step % config.resume_every == 0:
                _save_state(run, out, seed, arm)
    record = {"seed": seed, "arm": arm, "rope_theta": config.theta_of(arm), "branches": run.branches,
              "steps": run.log}
    _write_json(record_path(out, seed, arm), record)
    state_path(out, seed, arm).unlink(missing_ok=True)
    return record


def _batch(config: TrainConfig, arm: str, data: TokenData, seed: int, step: int) -> np.ndarray:
    """Token ids ``[batch, window]`` of ``step``: packed stage-A windows, or single-document extension windows.

    Every extension arm reads the same long windows at the same step (stream 1 of the seed); the short arm
    cuts each into ``ext_factor`` windows, so the arms see the same tokens and differ only in window and base.
    """
    if arm == "stageA":
        windows = data.windows(config.window)
        return np.asarray(windows[batch_windows(len(windows), config.batch, step, seed, 0)], np.int64)
    rows = batch_windows(len(data.chunks), config.batch // config.ext_factor, step, seed, 1)
    chunks = np.asarray(data.chunks[rows], np.int64)  # [batch / ext_factor, ext_window]
    return chunks.reshape(-1, config.window_of(arm))


def _optimizer(model, config: TrainConfig, peak: float):
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]  # norm gains: no weight decay
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=peak, betas=(0.9, config.beta2), eps=1e-8)


def _resume(config: TrainConfig, out: Path, seed: int, arm: str, data: TokenData) -> Run:
    """The run from its resume state, or fresh: stage A from ``seed``, an arm from the final stage-A branch."""
    import torch

    peak = config.lr if arm == "stageA" else config.ext_lr
    path = state_path(out, seed, arm)
    if arm == "stageA":
        model = build_model(config, arm, data.eot, seed=seed)
    else:
        from transformers import LlamaForCausalLM

        from qkplast.train.model import llama_config

        start = snapshot(hub_cache(out), repo_id(seed), branch_name("stageA", config.steps))
        model = LlamaForCausalLM.from_pretrained(start, config=llama_config(config, arm, data.eot), dtype=torch.float32)
    model.train()
    run = Run(model, _optimizer(model, config, peak))
    if path.exists():
        state = torch.load(path, weights_only=False)
        run.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        run.step, run.log, run.branches = state["step"], state["log"], state["branches"]
    return run


def _save_state(run: Run, out: Path, seed: int, arm: str) -> None:
    import torch

    state = {"step": run.step, "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
             "rng": torch.get_rng_state(), "log": run.log, "branches": run.branches}
    path = state_path(out, seed, arm)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _publish(model, out: Path, seed: int, arm: str, step: int) -> str:
    """Save the model with the training's tokenizer and add it to the hub cache as the checkpoint's branch."""
    from transformers import AutoTokenizer

    # local_files_only explicit: the tokenizer config records it, and the commit must not depend on HF_HUB_OFFLINE
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer", local_files_only=True)
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
