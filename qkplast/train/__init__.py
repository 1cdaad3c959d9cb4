"""Training: a TrainConfig and a corpus in; checkpoints (branches of a local hub cache), resume state and training.json out.

Issue 24: a small Llama trained here through pre-training (stage A) and a long-context extension (stage B) in
arms that separate the RoPE base from the window length, so the thesis's training dynamics (section 6.3) can
be rerun. :mod:`~qkplast.train.config` (settings, presets, study file), :mod:`~qkplast.train.tokenizer`,
:mod:`~qkplast.train.data`, :mod:`~qkplast.train.model`, :mod:`~qkplast.train.loop` (one run),
:mod:`~qkplast.train.run` (every seed and arm), :mod:`~qkplast.train.hub` (the checkpoints as branches) and
:mod:`~qkplast.train.evaluate` (loss by position, attention sink, geometry of every checkpoint).
"""

from qkplast.train.config import ARMS, PRESETS, TrainConfig, TrainConfigError, TrainStudy, load_train_study, theta_bound
from qkplast.train.hub import branch_name, hub_cache, repo_id, snapshot
from qkplast.train.run import load_training, train, training_complete

__all__ = ["ARMS", "PRESETS", "TrainConfig", "TrainConfigError", "TrainStudy", "branch_name", "hub_cache",
           "load_train_study", "load_training", "repo_id", "snapshot", "theta_bound", "train", "training_complete"]
