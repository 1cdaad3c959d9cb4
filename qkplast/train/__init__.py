"""Training: a TrainConfig and a corpus in; checkpoints (branches of a local hub cache), resume state and training.json out.

Issue 24: a small Llama trained here through pre-training (stage A) and a long-context extension (stage B) in
arms that separate the RoPE base from the window length, so the thesis's training dynamics (section 6.3) can
be rerun. :mod:`~qkplast.train.config` (settings, presets, study file), :mod:`~qkplast.train.tokenizer`,
:mod:`~qkplast.train.data`, :mod:`~qkplast.train.model`, :mod:`~qkplast.train.loop` (one run),
:mod:`~qkplast.train.run` (every seed and arm), :mod:`~qkplast.train.hub` (the checkpoints as branches) and
:mod:`~qkplast.train.evaluate` (loss by position, attention sink, geometry of every checkpoint).
"""

from qkplast.train.config import ARMS, PRESETS, TrainConfig, TrainConfigError, TrainStudy, load_train_study, theta_bound

__all__ = ["ARMS", "PRESETS", "TrainConfig", "TrainConfigError", "TrainStudy", "branch_name", "hub_cache",
           "load_train_study", "load_training", "repo_id", "snapshot", "theta_bound", "train", "training_complete"]


def __getattr__(name: str):
    """The names of :mod:`~qkplast.train.hub` and :mod:`~qkplast.train.run`, imported on first use (PEP 562):
    they import the capture path (xarray, transformers), which ``qkplast train``'s parser, reading only
    :mod:`~qkplast.train.config`, never needs."""
    if name in ("branch_name", "hub_cache", "repo_id", "snapshot"):
        from qkplast.train import hub

        return getattr(hub, name)
    if name in ("load_training", "train", "training_complete"):
        from qkplast.train import run

        return getattr(run, name)
    raise AttributeError(f"module 'qkplast.train' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
