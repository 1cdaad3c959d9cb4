"""The training configuration: one frozen dataclass, its presets, and the training study file.

Every setting of :func:`qkplast.train.train` is a field of :class:`TrainConfig`, passed whole; the command
line (``qkplast train``) makes one flag per field and a study file's ``train:`` mapping names the same fields.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Literal

from qkplast.errors import QkplastError
from qkplast.options import typed_option

__all__ = ["ARMS", "EXECUTION_FIELDS", "PRESETS", "TrainConfig", "TrainConfigError", "TrainStudy",
           "corpus_parts", "load_train_study", "theta_bound"]

#: The extension arms: ``rescaled`` (theta x theta_factor, window x ext_factor, as SmolLM3 did), ``control``
#: (theta unchanged, window x ext_factor) and ``rescaled-short`` (theta x theta_factor, window unchanged), the
#: third separating the base from the window length.
ARMS = ("rescaled", "control", "rescaled-short")

#: Fields that do not decide the trained weights by themselves (only how fast they come): a resumed training may
#: change them. ``device`` is a request (``auto`` may resolve to either device); the device it resolves to can
#: change the weights, so it is recorded in every run and a run never continues on another (see TrainConfig).
EXECUTION_FIELDS = ("workers", "resume_every", "device")


class TrainConfigError(QkplastError):
    """A training setting is out of range, of the wrong type, or unknown."""


def theta_bound(window: int) -> float:
    """The smallest RoPE base for a context of ``window`` tokens by Men et al. (2024): ``0.0424 L^1.628``.

    Their fit of the base-versus-length bound; a base below it cannot resolve the whole window. The
    stage-A base should lie above it; the control arm of the extension deliberately falls below it.
    """
    return 0.0424 * float(window) ** 1.628


@dataclass(frozen=True)
class TrainConfig:
    """Settings of a miniature training (issue 24): a Llama-style model trained in two stages.

    Model
    -----
    layers : int
        Decoder layers (4).
    hidden : int
        Residual width d (128).
    heads : int
        Query heads per layer (4).
    kv_heads : int
        Key/value heads per layer (2: grouped-query attention, two query heads per key head).
    head_dim : int
        Dimension of a query/key head (32: 16 rotary frequency pairs).
    ffn : int
        Width of the SwiGLU feed-forward layer (384 = 3 d).
    vocab_size : int
        Byte-level BPE vocabulary trained on the training documents (4096).

    Data
    ----
    corpus : str
        Corpus the tokenizer and the model are trained on (python-docs, see qkplast.capture.corpus); corpora
        joined by ``+`` (``python-docs+stdlib-code``) are a mix: each is split into training and held-out
        documents on its own, then the parts are concatenated in the order written (ids ``corpus:id``).
    max_docs : int or None
        Use only the first documents of the corpus, of each corpus of a mix (None: all of them).
    heldout_every : int
        Every n-th document (corpus order, the n-th, 2n-th, ...) is held out: never trained on, it gives the
        evaluation windows and the captures (20).
    copy_share : float
        Expected share of the training windows that carry a copied span (0: none). At every step a draw of
        ``(seed, step)`` picks the windows (binomially) and writes into each ``copy_len`` tokens drawn uniformly
        from the vocabulary (never the end-of-text token), and the same tokens again at a distance drawn
        uniformly from ``[copy_len, W - copy_len]`` of its window W (up to 4L in the long windows of the
        extension; :func:`qkplast.train.data.copy_windows`).
    copy_len : int
        Tokens of a copied span (16).
    bos : bool
        Every window, in training and in every measurement, starts with ``<|endoftext|>`` in place of its first
        token, as the documents of a hub model start with its BOS token (False: a window starts wherever the
        packed stream is cut). The checkpoints' tokenizer then puts the token in front of a text, so a capture
        of them starts its windows with it too. Added after the full run of ``bos: false`` formed no attention
        sink in any seed (``studies/miniature-pilots.yaml``).

    Stage A (pre-training)
    ----------------------
    window : int
        Tokens per training window (256); documents are packed, separated by the end-of-text token.
    rope_theta : float
        RoPE base of stage A (1000, above the Men et al. bound of about 353 for 256 tokens).
    steps : int
        Optimiser steps of stage A.
    batch : int
        Windows per step of stage A (8).
    lr : float
        Peak learning rate of stage A.
    warmup : int
        Linear warm-up steps of stage A, then the ``schedule``'s decay to ``min_lr_ratio * lr``.
    checkpoints : int
        Stage-A checkpoints after step 0, log-spaced from ``first_checkpoint * steps`` to ``steps``.
    first_checkpoint : float
        Share of stage A at the first checkpoint after step 0 (0.01: half-decades 1%, 3.2%, 10%, 32%, 100%).

    Stage B (extension)
    -------------------
    arms : tuple of str
        Extension arms trained from the stage-A checkpoint ``ext_from`` names (see :data:`ARMS`).
    ext_from : {"final", "predecay"}
        Where the arms start: the final stage-A checkpoint with a fresh AdamW (``final``), or (``wsd`` only) the
        stage-A checkpoint at the start of its decay, a branch of its own, with AdamW's state of that step, so
        that the arms continue the stable phase without re-warming (``ext_warmup`` 0 is then meaningful).
    ext_factor : int
        Window multiplier of the extension (4: 256 -> 1024 tokens); every arm keeps the tokens per step of
        stage A (``batch / ext_factor`` long windows per step).
    theta_factor : float
        RoPE base multiplier of the rescaled arms (10).
    ext_steps : int
        Optimiser steps of each extension arm, counted from the start of the extension.
    ext_lr : float
        Peak learning rate of the extension (warm-up, then the ``schedule``'s decay; with ``predecay`` the rate
        the stable phase continues at).
    ext_warmup : int
        Warm-up steps of the extension.
    ext_checkpoints : int
        Extension checkpoints after extension step 0, log-spaced from ``ext_first_checkpoint * ext_steps``.
    ext_first_checkpoint : float
        Share of the extension at its first checkpoint after step 0 (0.05: 5%, 22%, 100%).

    Optimisation
    ------------
    weight_decay : float
        AdamW weight decay on matrices (0.1; none on norms).
    beta2 : float
        AdamW second-moment decay (0.95; beta1 is 0.9).
    grad_clip : float
        Gradient norm clip (1.0).
    min_lr_ratio : float
        Learning rate at the end of each decay, as a share of its peak (0.1).
    schedule : {"cosine", "wsd"}
        Learning-rate schedule of stage A and of each arm after the linear warm-up: a cosine decay over the
        remaining steps (``cosine``), or warmup-stable-decay (``wsd``): the peak held, then over the last
        ``decay_share`` of the steps a ``1 - sqrt`` decay (Hägele et al. 2024) to ``min_lr_ratio * peak``.
    decay_share : float
        Share of the steps (stage A, and each arm) in the decay of ``wsd`` (0.2).

    Seeds and execution
    -------------------
    seeds : int
        Independent trainings, seeds 0 .. seeds-1 (initialisation and data order): the unit of every interval.
    threads : int
        Torch threads per training process (1, fixed so that the weights do not depend on the machine's cores).
    workers : int
        Trainings run at once, each in its own process (2: one per core here); no effect on the weights.
    device : {"cpu", "cuda", "auto"}
        Where the runs train (cpu; ``auto``: the GPU when torch sees one). On the GPU the forward pass and the
        loss run under bf16 autocast (weights and AdamW state in float32). The resolved device (and the GPU's
        name) is recorded in every run's record and in training.json; a run never resumes on another device.
    log_every : int
        Steps between entries of the loss log in training.json.
    resume_every : int
        Steps between resume states in DIR/state/ (besides every checkpoint); no effect on the weights.

    Notes
    -----
    What is bit-identical. On the CPU every run trains in a spawned worker process with one thread, ATen's
    non-vectorised kernels (``ATEN_CPU_CAPABILITY=default``) and MKL's conditional numerical reproducibility
    (``MKL_CBWR=COMPATIBLE``; every matrix product of the miniature is an MKL sgemm, oneDNN is not on its path):
    the weights are the same bit for bit for the same weight-changing settings on any x86-64 CPU (Intel or
    AMD), whatever ``workers``, and a run killed and resumed gives the same bits. On the GPU a run is seeded
    (the same initialisation as on the CPU, the same batches) and resumable from the same state files, with
    deterministic algorithms where torch has them; its weights are not bitwise the CPU's, nor the same across
    GPU models, driver or library versions (bf16 autocast and cuBLAS/cuDNN kernels differ).
    """

    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    ffn: int = 384
    vocab_size: int = 4096
    corpus: str = "python-docs"
    max_docs: int | None = None
    heldout_every: int = 20
    copy_share: float = 0.0
    copy_len: int = 16
    bos: bool = False
    window: int = 256
    rope_theta: float = 1000.0
    steps: int = 240
    batch: int = 8
    lr: float = 5e-3
    warmup: int = 24
    checkpoints: int = 5
    first_checkpoint: float = 0.01
    arms: tuple[str, ...] = ARMS
    ext_from: Literal["final", "predecay"] = "final"
    ext_factor: int = 4
    theta_factor: float = 10.0
    ext_steps: int = 40
    ext_lr: float = 2e-3
    ext_warmup: int = 4
    ext_checkpoints: int = 3
    ext_first_checkpoint: float = 0.05
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    min_lr_ratio: float = 0.1
    schedule: Literal["cosine", "wsd"] = "cosine"
    decay_share: float = 0.2
    seeds: int = 3
    threads: int = 1
    workers: int = 2
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    log_every: int = 1
    resume_every: int = 25

    def __post_init__(self):
        for f in fields(self):
            try:
                object.__setattr__(self, f.name, typed_option(type(self), f.name, getattr(self, f.name)))
            except QkplastError as exc:
                raise TrainConfigError(f"training setting {str(exc).removeprefix('option ')}") from None
        object.__setattr__(self, "arms", tuple(str(a) for a in self.arms))
        for message in _problems(self):
            raise TrainConfigError(message)

    @classmethod
    def from_kwargs(cls, config: "TrainConfig | None" = None, **overrides) -> "TrainConfig":
        """A config from an optional base plus keyword overrides; an unknown name is an error naming the valid ones."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise TrainConfigError(f"unknown training setting(s) {unknown}; valid settings: {', '.join(names)}")
        return replace(config or cls(), **overrides)

    def to_dict(self) -> dict:
        """Every field, tuples as lists (the form a JSON round trip gives)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def result_key(self) -> dict:
        """The fields that can change the trained weights: all but :data:`EXECUTION_FIELDS`."""
        return {k: v for k, v in self.to_dict().items() if k not in EXECUTION_FIELDS}

    # ------------------------------------------------------------------ derived settings

    @property
    def ext_window(self) -> int:
        """Window of the long-window arms."""
        return self.window * self.ext_factor

    def window_of(self, arm: str) -> int:
        """Training window of ``arm`` (``stageA`` or an extension arm)."""
        return self.ext_window if arm in ("rescaled", "control") else self.window

    def theta_of(self, arm: str) -> float:
        """RoPE base of ``arm``."""
        return self.rope_theta * (self.theta_factor if arm in ("rescaled", "rescaled-short") else 1.0)

    def steps_of(self, arm: str) -> int:
        return self.steps if arm == "stageA" else self.ext_steps

    def decay_start(self, arm: str) -> int:
        """First step of ``arm``'s decay under ``wsd`` (its steps less ``round(decay_share * steps)``)."""
        total = self.steps_of(arm)
        return total - round(self.decay_share * total)

    @property
    def ext_start(self) -> int:
        """The stage-A step the extension arms start from: the last, or the start of the decay (``predecay``)."""
        return self.decay_start("stageA") if self.ext_from == "predecay" else self.steps

    def checkpoint_steps(self, arm: str) -> list[int]:
        """Step 0 and the log-spaced checkpoints of ``arm`` (stage A, or an arm counted from the extension's start);
        stage A also at :attr:`ext_start`, the arms' starting point."""
        if arm == "stageA":
            return sorted({*log_spaced(self.steps, self.checkpoints, self.first_checkpoint), self.ext_start})
        return log_spaced(self.ext_steps, self.ext_checkpoints, self.ext_first_checkpoint)


def log_spaced(total: int, count: int, first: float) -> list[int]:
    """Step 0 and ``count`` steps spaced evenly in log from ``first * total`` to ``total`` (rounded, distinct)."""
    if count == 1:
        return [0, total]
    ratios = [first ** (1 - i / (count - 1)) for i in range(count)]  # first ... 1, geometric
    return sorted({0, *(max(1, round(r * total)) for r in ratios)})


def _problems(c: TrainConfig) -> list[str]:
    """Every inconsistency of ``c``, as one-line messages naming the field and the fix."""
    out = []
    for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "window", "steps", "batch",
                 "checkpoints", "ext_factor", "ext_steps", "ext_checkpoints", "seeds", "threads", "workers",
                 "log_every", "resume_every", "heldout_every"):
        if getattr(c, name) < 1:
            out.append(f"training setting {name} must be >= 1, got {getattr(c, name)}")
    if c.heldout_every < 2:
        out.append(f"heldout_every must be >= 2 (1 would hold every document out), got {c.heldout_every}")
    if c.vocab_size < 300:
        out.append(f"vocab_size must be >= 300 (256 bytes, the end-of-text token and some merges), got {c.vocab_size}")
    if c.heads % max(c.kv_heads, 1):
        out.append(f"heads ({c.heads}) must be a multiple of kv_heads ({c.kv_heads}) for grouped-query attention")
    if c.head_dim % 2:
        out.append(f"head_dim must be even (RoPE rotates pairs of dimensions), got {c.head_dim}")
    if c.batch % max(c.ext_factor, 1):
        out.append(f"batch ({c.batch}) must be a multiple of ext_factor ({c.ext_factor}): the extension keeps the "
                   "tokens per step with batch/ext_factor long windows")
    for name in ("rope_theta", "theta_factor", "lr", "ext_lr", "grad_clip"):
        if not (math.isfinite(getattr(c, name)) and getattr(c, name) > 0):
            out.append(f"training setting {name} must be a positive number, got {getattr(c, name)}")
    for name in ("first_checkpoint", "ext_first_checkpoint", "min_lr_ratio", "beta2"):
        if not 0 < getattr(c, name) <= 1:
            out.append(f"training setting {name} must lie in (0, 1], got {getattr(c, name)}")
    if c.weight_decay < 0:
        out.append(f"weight_decay must be >= 0, got {c.weight_decay}")
    for warm, total in (("warmup", "steps"), ("ext_warmup", "ext_steps")):
        if not 0 <= getattr(c, warm) < getattr(c, total):
            out.append(f"{warm} ({getattr(c, warm)}) must be >= 0 and shorter than {total} ({getattr(c, total)})")
    unknown = [a for a in c.arms if a not in ARMS]
    if unknown or len(set(c.arms)) != len(c.arms) or not c.arms:
        out.append(f"arms must be distinct names from {ARMS}, got {list(c.arms)}")
    if c.max_docs is not None and c.max_docs < 2 * c.heldout_every:
        out.append(f"max_docs {c.max_docs} leaves fewer than two held-out documents; raise it or lower heldout_every")
    return out + _data_problems(c) + _schedule_problems(c)


def corpus_parts(corpus: str) -> list[str]:
    """The corpora of a ``+``-joined mix (``python-docs+stdlib-code``), in order; one corpus is a list of one.

    A path that exists is one corpus even if its name holds a ``+``.
    """
    return [corpus] if "+" not in corpus or Path(corpus).exists() else corpus.split("+")


def _data_problems(c: TrainConfig) -> list[str]:
    out = []
    parts = corpus_parts(c.corpus)
    if any(not p.strip() for p in parts) or len(set(parts)) != len(parts):
        out.append(f"corpus {c.corpus!r}: a mix names distinct, non-empty corpora joined by '+' "
                   "(e.g. python-docs+stdlib-code)")
    if not 0 <= c.copy_share <= 1:
        out.append(f"copy_share must lie in [0, 1], got {c.copy_share}")
    if c.copy_len < 1:
        out.append(f"copy_len must be >= 1, got {c.copy_len}")
    elif c.copy_share > 0 and 2 * c.copy_len > c.window:
        out.append(f"copy_len ({c.copy_len}) must be at most window/2 ({c.window // 2}): a span and its copy, at a "
                   "distance of at least copy_len, fit in one window")
    return out


def _schedule_problems(c: TrainConfig) -> list[str]:
    out = []
    if not 0 < c.decay_share < 1:
        out.append(f"decay_share must lie in (0, 1), got {c.decay_share}")
    elif c.schedule == "wsd":
        for arm, warm in (("stageA", "warmup"), ("rescaled", "ext_warmup")):
            total, name = c.steps_of(arm), "steps" if arm == "stageA" else "ext_steps"
            if c.decay_start(arm) >= total:
                out.append(f"decay_share {c.decay_share} of {name} ({total}) is no step: raise decay_share or {name}")
            elif getattr(c, warm) > c.decay_start(arm):
                out.append(f"{warm} ({getattr(c, warm)}) must end before the decay starts at step "
                           f"{c.decay_start(arm)} of {name}; lower {warm} or decay_share")
    if c.ext_from == "predecay" and c.schedule != "wsd":
        out.append("ext_from 'predecay' needs schedule 'wsd' (a cosine has no stable phase to branch from); "
                   "set schedule: wsd or ext_from: final")
    return out


# --------------------------------------------------------------------------- presets

#: Named configurations. ``default``: the miniature of the book (3 seeds, three arms; a few minutes on two
#: cores). ``smoke``: a model of two layers on 60 documents, for tests (under a minute).
PRESETS = {
    "default": TrainConfig(),
    "smoke": TrainConfig(layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, ffn=128, vocab_size=1024,
                         max_docs=60, heldout_every=10, window=64, steps=100, batch=8, lr=5e-3, warmup=10,
                         checkpoints=3, first_checkpoint=0.1, ext_steps=8, ext_lr=3e-3, ext_warmup=1,
                         ext_checkpoints=2, ext_first_checkpoint=0.25, seeds=2, workers=1, resume_every=10),
}


# --------------------------------------------------------------------------- study file

STUDY_KEYS = ("name", "out", "preset", "train", "description")


@dataclass(frozen=True)
class TrainStudy:
    """A training study file: its name, output directory (a relative path is taken from the current
    directory, as a capture study's ``out``; None when the file names none) and config."""

    name: str
    out: Path | None
    config: TrainConfig
    path: Path | None = None


def load_train_study(path, overrides: dict | None = None, preset: str | None = None) -> TrainStudy:
    """Read a training study file (YAML)::

        name: miniature                           # required: a name for the training
        out: runs/smollm2-135m/training/miniature  # optional: where it trains (``--out`` wins)
        preset: default                            # optional: the preset the ``train`` fields modify
        train: {seeds: 3, steps: 300}              # optional: TrainConfig fields
        description: ...                           # optional: free text

    ``preset`` (the command line's ``--preset``) replaces the file's; ``overrides`` (its flags) apply last.
    Every problem is a one-line :class:`TrainConfigError`.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise TrainConfigError(f"training study file {str(path)!r} does not exist (see studies/miniature.yaml)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TrainConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise TrainConfigError(f"{path}: a training study is a mapping with keys {list(STUDY_KEYS)}")
    unknown = sorted(set(data) - set(STUDY_KEYS))
    if unknown:
        raise TrainConfigError(f"{path}: unknown key(s) {unknown}; a training study has {list(STUDY_KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise TrainConfigError(f"{path}: 'name' must be a non-empty string")
    train = data.get("train") or {}
    if not isinstance(train, dict):
        raise TrainConfigError(f"{path}: 'train' must be a mapping of training settings, got {type(train).__name__}")
    config = config_from(preset or data.get("preset", "default"), {**train, **(overrides or {})}, where=str(path))
    out = data.get("out")
    if out is not None and not isinstance(out, str):
        raise TrainConfigError(f"{path}: 'out' must be a path string, got {out!r}")
    return TrainStudy(name=name, out=None if out is None else Path(out), config=config, path=path)


def config_from(preset: str, settings: dict, where: str = "") -> TrainConfig:
    """``PRESETS[preset]`` with ``settings`` applied; errors are prefixed by ``where``."""
    prefix = f"{where}: " if where else ""
    if preset not in PRESETS:
        raise TrainConfigError(f"{prefix}unknown preset {preset!r}; one of {sorted(PRESETS)}")
    try:
        return TrainConfig.from_kwargs(PRESETS[preset], **settings)
    except QkplastError as exc:
        raise TrainConfigError(f"{prefix}{exc}") from None
