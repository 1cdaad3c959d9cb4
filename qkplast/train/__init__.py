"""Training: a TrainConfig and a corpus in; checkpoints (branches of a local hub cache), resume state and training.json out.

Issue 24: a small Llama trained here through pre-training (stage A) and a long-context extension (stage B) in
arms that separate the RoPE base from the window length, so the thesis's training dynamics (section 6.3) can
be rerun. :mod:`~qkplast.train.config` (settings, presets, study file), :mod:`~qkplast.train.tokenizer`,
:mod:`~qkplast.train.data`, :mod:`~qkplast.train.model`, :mod:`~qkplast.train.loop` (one run),
:mod:`~qkplast.train.run` (every seed and arm), :mod:`~qkplast.train.hub` (the checkpoints as branches) and
:mod:`~qkplast.train.evaluate` (loss by position, attention sink, geometry of every checkpoint).
"""

from qkplast.lazy import lazy_names
from qkplast.train.config import ARMS, PRESETS, TrainConfig, TrainConfigError, TrainStudy, load_train_study, theta_bound

__all__ = ["ARMS", "PRESETS", "TrainConfig", "TrainConfigError", "TrainStudy", "branch_name", "hub_cache",
           "load_train_study", "load_training", "repo_id", "snapshot", "theta_bound", "train", "training_complete"]


#: Where the names not imported above live. They load on first use (PEP 562): :mod:`~qkplast.train.hub` and
#: :mod:`~qkplast.train.run` import the capture path (xarray, transformers), which ``qkplast train``'s parser,
#: reading only :mod:`~qkplast.train.config`, never needs.
_HOMES = {"hub": ("branch_name", "hub_cache", "repo_id", "snapshot"), "run": ("load_training", "train", "training_complete")}

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
