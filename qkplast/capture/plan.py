"""Plan a capture from the config alone: windows, heads, expected peak memory, and whether it fits.

:func:`plan_capture` reads only the model's config and tokenizer (no weight)
and the corpus (tokenized, not run), and predicts

* the windows the corpus yields for the options (:func:`qkplast.capture.corpus.iter_windows`, one pass);
* the heads sampled: the layout predicted from the config
  (:func:`qkplast.capture.architecture.architecture_from_config`) and the same draw as the capture
  (:func:`qkplast.capture.sampling.sample_heads`);
* the expected peak memory of the capture's forward pass:
  ``weights + activation bytes per token x seq_len``, where

  - weights = parameter count (the model built on the ``meta`` device from
    its config) x bytes per element of the dtype;
  - activation bytes per token = ``KAPPA x E x bytes per element``, with ``E``
    the elements per token live at the peak of one decoder layer
    (:func:`live_elements_per_token`: the residual stream, the input
    embedding, RoPE's cos/sin, and the larger of the attention phase, q/k/v
    before and after RoPE plus the kernel's output, and the MLP phase,
    gate/up/activation/product);
  - ``KAPPA`` the ratio of measured to counted bytes: measured on the CPU in
    float32 with tiny random models of the four real architectures (Qwen3
    with YaRN, Llama 3.x, SmolLM3 with NoPE layers, Mllama text), the slope of
    peak RSS over 8K-32K tokens of a bare forward, each length in a fresh
    process (:data:`MEASURED_KAPPA`, command below). Assumptions for the GPU:
    the same tensors are live in bfloat16 (2 bytes), the flash/efficient
    kernels add only their O(seq_len x heads) log-sum-exp buffer (counted),
    and the CUDA context and allocator reserve add :data:`CUDA_OVERHEAD_GB`.

In 16-bit models the float32 copies the norms make (and the q/k norms of Qwen3-like models) are counted
where they would set the peak (:func:`upcast_bytes_per_token`); the forward passes that need logits
(chapters 12 and 13, :mod:`qkplast.experiments.behavior`) run the LM head in chunks of
:data:`LOGITS_CHUNK_BYTES` and are counted as the row ``logits pass`` (:func:`logits_pass_gb`); with
``device="cuda:all"`` the weights are counted per GPU. :func:`size_code_capture` sizes the second capture a
run makes (notebook 09's code) to what its corpus yields.

:meth:`CapturePlan.check` refuses a plan whose window exceeds the (RoPE-scaled) config, whose kernel needs ``seq_len^2``
memory (:mod:`qkplast.capture.kernel_guard`), whose corpus is too short, or whose peak
exceeds the device's memory. ``str(plan)`` is a readable table.

One plan is the *preflight* of one capture: :func:`preflight` (``plan_capture(..., strict=True)``) loads the
config and the tokenizer once, counts the corpus's windows once (keeping them, so the capture does not cut the
corpus again), and raises at the first check that fails, in the order a capture meets them (window, device,
kernel, corpus). The plan is passed whole to :func:`qkplast.capture.driver.run_capture` (``plan=``), which
then checks nothing again; ``qkplast run`` makes one per capture before any weights load.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from qkplast.errors import QkplastError
from qkplast.options import CaptureOptions

__all__ = [
    "KAPPA",
    "MEASURED_KAPPA",
    "CUDA_OVERHEAD_GB",
    "PlanError",
    "CapturePlan",
    "live_elements_per_token",
    "activation_bytes_per_token",
    "upcast_bytes_per_token",
    "LOGITS_CHUNK_BYTES",
    "logits_chunk_rows",
    "logits_pass_gb",
    "plan_capture",
    "preflight",
    "CodeCapture",
    "size_code_capture",
]

#: Measured / counted activation bytes per token, per architecture (CPU, float32, tiny random models of
#: tests/hub_fixtures.py: hidden 64, intermediate 128, 2 query / 1 key head of dim 8, 2 layers, plus 1
#: cross-attention layer for Mllama), from the peak-RSS slope of a bare forward between 16384 and 32768
#: tokens, each length in a fresh process. Measured with
#: ``PYTHONPATH=. python benchmarks/bench_scale.py --kappa`` (2026-11-22, torch 2.13 CPU, glibc malloc
#: with a fixed mmap threshold): slopes 2630 / 2652 / 2635 / 2832 B/token against 2624 / 2624 / 2624 /
#: 2816 counted. In these tiny models the MLP phase is the larger one, as in every thesis model
#: (intermediate size 3-4x hidden), so the attention-phase count is not what was checked.
MEASURED_KAPPA = {"qwen3": 1.00, "llama3": 1.01, "smollm3": 1.00, "mllama": 1.01}
#: The value the planner uses: the largest measured ratio.
KAPPA = max(MEASURED_KAPPA.values())
#: CUDA context, cuBLAS workspaces and the caching allocator's reserve (assumed, not measured here).
CUDA_OVERHEAD_GB = 2.0
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_GB = 2**30


class PlanError(QkplastError):
    """The planned capture cannot run as asked (kernel, corpus or memory); the message names the fix."""


def _dims(config) -> tuple[int, int, int, int, int]:
    text = config.get_text_config()
    h, i = int(text.hidden_size), int(text.intermediate_size)
    n_q = int(text.num_attention_heads)
    n_kv = int(getattr(text, "num_key_value_heads", None) or n_q)
    d = int(getattr(text, "head_dim", None) or h // n_q)
    return h, i, n_q, n_kv, d


def live_elements_per_token(config) -> int:
    """Elements per token live at the peak of a decoder forward (no cache, no LM head); see the module doc.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The (text) config: ``hidden_size``, ``intermediate_size``, head counts and ``head_dim``.
    """
    h, i, n_q, n_kv, d = _dims(config)
    base = 2 * h + 2 * d  # residual stream, embedding output, RoPE cos and sin
    attention = h + 2 * (n_q + 2 * n_kv) * d + n_q * d + h  # normed input, q/k/v pre and post RoPE, kernel out, o_proj
    mlp = h + 3 * i + h  # normed input, gate, up, act(gate) * up, down
    return base + max(attention, mlp)


def _has_qk_norm(config) -> bool:
    """Whether the attention normalises q and k per head (Qwen3, OLMo-2 style): an RMSNorm over ``[seq, heads, d]``."""
    return config.get_text_config().model_type in ("qwen3", "qwen3_moe", "olmo2", "olmo3", "gemma3_text")


def upcast_bytes_per_token(config, dtype_bytes: int) -> int:
    """Bytes per token of the float32 copies a 16-bit model makes beside its own tensors, at their largest.

    transformers' RMSNorm computes in float32 (``hidden.to(torch.float32)``, then the normalised copy: two
    float32 tensors of the normed width live at once). In a float32 model the conversion is a no-op, so
    nothing is added. Two places can set the peak: the layer norms (``2 x 4 x hidden`` beside the 16-bit
    input) and, in models that normalise q and k per head, the q-norm (``2 x 4 x n_q x head_dim`` beside the
    normed input and the projected q).
    """
    if dtype_bytes >= 4:
        return 0
    h, _, n_q, _, d = _dims(config)
    norm = 2 * 4 * h
    qk = (h + n_q * d) * dtype_bytes + 2 * 4 * n_q * d if _has_qk_norm(config) else 0
    return max(norm, qk)


def activation_bytes_per_token(config, dtype: str, device: str) -> float:
    """Activation bytes per token at the peak of the capture's forward (no LM head).

    The larger of the decoder's own tensors (``KAPPA x E x bytes``, :func:`live_elements_per_token`) and the
    phase where the float32 upcasts of a 16-bit model peak (:func:`upcast_bytes_per_token`, over the
    residual stream, embedding output and RoPE tables), plus, on CUDA, the attention kernel's float32
    log-sum-exp row per query head.
    """
    h, _, n_q, _, d = _dims(config)
    per = _BYTES[dtype]
    own = KAPPA * live_elements_per_token(config) * per
    upcast = KAPPA * ((2 * h + 2 * d) * per + upcast_bytes_per_token(config, per))
    return max(own, upcast) + (4 * n_q if device.startswith("cuda") else 0)


#: Budget of one chunk of the LM head's logits in the forward passes that need them (``experiments.behavior``):
#: the logits in the model's dtype, their float64 copy and its ``log_softmax``, per scored position.
LOGITS_CHUNK_BYTES = 1 << 30


def logits_bytes_per_row(vocab_size: int, dtype_bytes: int) -> int:
    """Bytes one scored position costs in a logits chunk: the head's output, its float64 copy and log_softmax."""
    return int(vocab_size) * (int(dtype_bytes) + 8 + 8)


def logits_chunk_rows(vocab_size: int, dtype_bytes: int, budget: int = LOGITS_CHUNK_BYTES) -> int:
    """Scored positions per LM-head chunk so one chunk stays within ``budget`` bytes (at least one)."""
    return max(1, int(budget) // logits_bytes_per_row(vocab_size, dtype_bytes))


def logits_pass_gb(config, seq_len: int, dtype: str) -> float:
    """Activation GiB of a forward pass that scores every position (``loss_by_position``) beyond the weights.

    After the decoder returns: its last hidden state and the gathered rows of the scored positions (two
    ``seq_len x hidden`` tensors) and one logits chunk of :data:`LOGITS_CHUNK_BYTES` at most.
    """
    h = _dims(config)[0]
    per = _BYTES[dtype]
    vocab = int(config.get_text_config().vocab_size)
    rows = min(logits_chunk_rows(vocab, per), seq_len)
    return (2 * seq_len * h * per + rows * logits_bytes_per_row(vocab, per)) / _GB


@dataclass
class CapturePlan:
    """What a capture will do and need, predicted from the config, tokenizer and corpus alone.

    Attributes
    ----------
    options : CaptureOptions
        The options with ``seq_len`` and ``bucket_size`` resolved.
    commit : str or None
        The commit the model name resolves to (hub cache), if any.
    device, dtype : str
        Resolved device and compute dtype.
    windows : int or None
        Windows the corpus yields, at most ``options.docs`` (None: not counted).
    windows_wanted : int or None
        ``options.docs``.
    heads, heads_eligible : int
        Query heads sampled, and eligible (full-attention layers x query heads).
    eligible_layers, excluded_layers : list, dict
    n_params : int
    weights_gb, activations_gb, peak_gb : float
        Expected peak = weights (per GPU when spread over ``gpus``) + the larger of the capture's activations
        and the logits pass's (+ CUDA overhead on a GPU).
    logits_gb : float
        Activations of a forward pass that needs logits (chapters 12 and 13): the decoder's last hidden state,
        the scored rows and one LM-head chunk (:func:`logits_pass_gb`).
    gpus : int
        GPUs the weights are spread over (``--device cuda:all``: every visible one).
    bytes_per_token : float
        Activation bytes per token (``KAPPA x E x bytes``).
    device_memory_gb : float or None
        Memory of the device, given or detected.
    kernel_problem : str or None
        Why the attention kernel would need ``seq_len^2`` memory (:func:`qkplast.capture.kernel_guard.kernel_problem`).
    length_problem : str or None
        Why ``seq_len`` exceeds the (RoPE-scaled) config (:func:`qkplast.capture.models.check_seq_len`).
    config, model_info
        The model's config (RoPE override applied) and its provenance, as :func:`qkplast.capture.models.load_config`
        returned them: loaded once per plan.
    tokenizer, tokenizer_info
        The tokenizer that counted the windows (None when they were not counted), and its provenance when this
        plan loaded it (the model load then reads neither again: :func:`qkplast.capture.models.load_for`).
    corpus : qkplast.capture.corpus.Corpus or None
        The corpus the windows were counted in.
    kept_windows : list of qkplast.capture.corpus.Window or None
        The windows themselves when the plan is a capture's preflight (:func:`preflight`): the capture reads them
        instead of cutting the corpus again.
    window_stats : qkplast.capture.corpus.WindowStats or None
        What counting them read (the capture records it).
    """

    options: CaptureOptions
    commit: str | None
    device: str
    dtype: str
    windows: int | None
    windows_wanted: int | None
    heads: int
    heads_eligible: int
    eligible_layers: list = field(default_factory=list)
    excluded_layers: dict = field(default_factory=dict)
    n_params: int = 0
    weights_gb: float = 0.0
    activations_gb: float = 0.0
    peak_gb: float = 0.0
    bytes_per_token: float = 0.0
    device_memory_gb: float | None = None
    kernel_problem: str | None = None
    logits_gb: float = 0.0
    gpus: int = 1
    length_problem: str | None = None
    config: object = field(default=None, repr=False, compare=False)
    model_info: dict = field(default_factory=dict, repr=False, compare=False)
    tokenizer: object = field(default=None, repr=False, compare=False)
    tokenizer_info: dict | None = field(default=None, repr=False, compare=False)
    corpus: object = field(default=None, repr=False, compare=False)
    kept_windows: list | None = field(default=None, repr=False, compare=False)
    window_stats: object = field(default=None, repr=False, compare=False)

    def problems(self) -> list[str]:
        """One line per reason the capture cannot run as planned."""
        found = [self.length_problem] if self.length_problem else []
        if self.kernel_problem:
            found.append(self.kernel_problem)
        if self.windows is not None and self.windows_wanted is not None and self.windows < self.windows_wanted:
            found.append(
                f"corpus {self.options.corpus!r} yields {self.windows} window(s) of {self.options.seq_len} tokens but "
                f"{self.windows_wanted} were asked for; pass a corpus of longer documents, fewer --docs or a shorter "
                "--seq-len"
            )
        memory = self.memory_problem()
        if memory:
            found.append(memory)
        return found

    def corpus_error(self):
        """The error a capture raises for a corpus that yields fewer windows than asked, or None.

        :func:`qkplast.capture.corpus.shortfall` on what the plan counted (its hint counts other corpora, so it is
        made only when asked for); None when the windows were not counted.
        """
        from qkplast.capture.corpus import shortfall

        if self.windows is None:
            return None
        return shortfall(self.corpus, self.tokenizer, self.options, self.windows, self.window_stats)

    def memory_problem(self) -> str | None:
        """Why the expected peak does not fit the device, with the ways out; None when it fits."""
        if self.device_memory_gb is None or self.peak_gb <= self.device_memory_gb:
            return None
        ways = ["a shorter --seq-len"]
        if self.dtype == "float32":
            ways.append("--dtype bfloat16")
        if self.device.startswith("cuda") and self.gpus == 1:
            ways.append("--device cuda:all (the weights spread over every visible GPU)")
        ways.append("or a larger device")
        where = f"{self.device}" + (f" (per GPU, weights over {self.gpus})" if self.gpus > 1 else "")
        return (f"expected peak memory {self.peak_gb:.1f} GiB exceeds the {self.device_memory_gb:.1f} GiB of {where}; "
                f"use {', '.join(ways)}")

    def check(self) -> CapturePlan:
        """Raise :class:`PlanError` (one line: the first problem, and how many more) if the plan cannot run."""
        found = self.problems()
        if found:
            more = f" (and {len(found) - 1} more problem(s): see qkplast plan)" if len(found) > 1 else ""
            raise PlanError(found[0] + more)
        return self

    def rows(self) -> list[tuple[str, str]]:
        """The table of ``str(plan)`` as (item, value) rows."""
        o = self.options
        memory = "unknown" if self.device_memory_gb is None else f"{self.device_memory_gb:.1f} GiB"
        windows = "not counted" if self.windows is None else str(self.windows)
        wanted = "all" if self.windows_wanted is None else str(self.windows_wanted)
        return [
            ("model", o.model + (f"@{o.revision}" if o.revision else "")),
            ("commit", self.commit or "-"),
            ("rope scaling", o.rope_scaling or "-"),
            ("device / dtype / attn", f"{self.device} / {self.dtype} / {o.attn}"),
            ("corpus", f"{o.corpus} (short_docs={o.short_docs})"),
            ("windows (yielded / wanted)", f"{windows} / {wanted}"),
            ("seq_len / bucket_size", f"{o.seq_len} / {o.bucket_size} ({-(-o.seq_len // o.bucket_size)} buckets)"),
            ("samples per bucket per doc", f"{o.samples_per_bucket:g} (min {o.min_per_bucket})"),
            ("heads sampled / eligible", f"{self.heads} / {self.heads_eligible}"),
            ("eligible layers", f"{len(self.eligible_layers)} ({len(self.excluded_layers)} excluded)"),
            ("parameters", f"{self.n_params / 1e6:.1f} M"),
            ("weights", f"{self.weights_gb:.2f} GiB" + (f" per GPU (over {self.gpus})" if self.gpus > 1 else "")),
            ("activations", f"{self.activations_gb:.2f} GiB ({self.bytes_per_token:.0f} B/token x {o.seq_len})"),
            ("logits pass (ch. 12, 13)", f"{self.logits_gb:.2f} GiB (hidden states and one LM-head chunk)"),
            ("expected peak", f"{self.peak_gb:.2f} GiB"),
            ("device memory", memory),
            ("attention kernel", "linear in seq_len" if self.kernel_problem is None else "QUADRATIC: refused"),
            ("verdict", "fits" if not self.problems() else "REFUSED: " + "; ".join(self.problems())),
        ]

    def __str__(self) -> str:
        rows = self.rows()
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _resolve_lengths(options: CaptureOptions, config) -> CaptureOptions:
    from qkplast.capture.models import default_seq_len

    seq_len = options.seq_len or default_seq_len(config)
    return replace(options, seq_len=seq_len, bucket_size=options.bucket_size or max(1, seq_len // 16))


def _heads(config) -> tuple[int, int]:
    text = config.get_text_config()
    n_q = int(text.num_attention_heads)
    return n_q, int(getattr(text, "num_key_value_heads", None) or n_q)


def _kernel_problem(options: CaptureOptions, config, device: str, dtype) -> str | None:
    from qkplast.capture.kernel_guard import device_capability, kernel_problem

    from qkplast.capture.models import primary_device

    n_q, n_kv = _heads(config)
    return kernel_problem(options.attn, dtype, device.split(":")[0], device_capability(primary_device(device)),
                          options.seq_len, n_q, n_kv)


def preflight(options: CaptureOptions, documents=None, tokenizer=None, *, device_memory_gb: float | None = None,
              gpus: int | None = None, memory: bool = True) -> CapturePlan:
    """The plan of a capture about to run, raising at the first problem; every check that needs no weight, once.

    ``plan_capture(..., strict=True)``: the corpus opened (unless ``documents``), the config loaded (revision
    resolved offline, RoPE override applied), ``seq_len`` against it, the device, the attention kernel, the
    tokenizer (``options.tokenizer``, else the model's own; unless ``tokenizer``) cutting the corpus's windows
    (kept for the capture) and refusing fewer than ``options.docs``. The memory figures are computed (unless
    ``memory`` is False), not checked: ``plan.memory_problem()`` says whether they fit.

    Returns
    -------
    CapturePlan
        Pass it to :func:`qkplast.capture.driver.run_capture` (``plan=``); ``plan.options`` are the resolved options.
    """
    return plan_capture(options, device_memory_gb=device_memory_gb, gpus=gpus, documents=documents,
                        tokenizer=tokenizer, strict=True, memory=memory)


def _parameter_count(config) -> int:
    """Parameters of the model the config describes, built on the meta device (no memory, no weights)."""
    import torch

    from qkplast.capture.models import auto_model_class

    with torch.device("meta"):
        model = auto_model_class(config).from_config(config)
    return sum(p.numel() for p in model.parameters())


def _device_memory_gb(device: str) -> float | None:
    import os

    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        from qkplast.capture.models import primary_device

        return torch.cuda.get_device_properties(torch.device(primary_device(device))).total_memory / _GB
    if device == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _GB
        except (ValueError, OSError):
            return None
    return None


def plan_capture(options: CaptureOptions, *, device_memory_gb: float | None = None, count: bool = True,
                 gpus: int | None = None, documents=None, tokenizer=None, strict: bool = False,
                 memory: bool = True) -> CapturePlan:
    """Plan the capture ``options`` describe, from the config, tokenizer and corpus alone (no weights).

    Parameters
    ----------
    options : CaptureOptions
        ``model`` may be ``owner/name@revision``; ``device="auto"`` plans for
        CUDA when a GPU is visible; ``device="cuda:all"`` spreads the weights over ``gpus``.
    device_memory_gb : float, optional
        Memory of the target device (one GPU) in GiB (default: detected, the GPU's or the host's).
    count : bool
        Count the corpus's windows (tokenizing it); False plans the memory alone.
    gpus : int, optional
        GPUs the weights are spread over with ``device="cuda:all"`` (default: the visible ones, at least 1).
    documents : Corpus, optional
        The corpus, already open (default: opened from ``options``).
    tokenizer : optional
        The tokenizer that cuts the corpus (default: loaded from ``options``, once).
    strict : bool
        The preflight of a capture about to run (:func:`preflight`): the device must exist here, the first
        problem is raised (the window, the device, the kernel, the corpus, in that order) and the windows are
        kept for the capture.
    memory : bool
        Sample the heads and plan the memory (the model built on the meta device); False leaves those fields
        at zero (a capture that checks no memory needs neither).

    Returns
    -------
    CapturePlan
        Print it for the table; :meth:`CapturePlan.check` raises when it cannot run.
    """
    from qkplast.capture.corpus import open_corpus_for, shortfall
    from qkplast.capture.kernel_guard import KernelError
    from qkplast.capture.models import ModelError, check_seq_len, load_config, loading_device, resolve_dtype

    if strict and count and documents is None:
        documents = open_corpus_for(options)  # a corpus that cannot be read is named before the model is resolved
    config, info = load_config(options.model, revision=options.revision, rope_scaling=options.rope_scaling)
    options = _resolve_lengths(options, config)
    try:
        check_seq_len(config, options.seq_len, rope_scaling=info["rope_scaling"])
        length_problem = None
    except ModelError as exc:
        if strict:
            raise
        length_problem = str(exc)
    # a capture needs its device here; a plan may be made for a GPU elsewhere
    device = loading_device(options.device) if strict else _planned_device(options.device)
    dtype = str(resolve_dtype(options.dtype, device)).removeprefix("torch.")
    kernel = _kernel_problem(options, config, device, dtype)
    if strict and kernel is not None:
        raise KernelError(kernel)
    counted = _windows(options, documents, tokenizer, keep=strict) if count else _Counted()
    if strict and count and counted.found < (options.docs or 1):
        raise shortfall(counted.corpus, counted.tokenizer, options, counted.found, counted.stats)
    device_memory_gb = device_memory_gb if device_memory_gb is not None else _device_memory_gb(device)
    return CapturePlan(
        options=options, commit=info.get("commit"), device=device, dtype=dtype, windows=counted.found,
        windows_wanted=options.docs, device_memory_gb=device_memory_gb, kernel_problem=kernel,
        length_problem=length_problem, config=config, model_info=info, tokenizer=counted.tokenizer,
        tokenizer_info=counted.tokenizer_info,
        corpus=counted.corpus, kept_windows=counted.kept, window_stats=counted.stats,
        **(_layout_and_memory(options, config, device, dtype, gpus) if memory else {"heads": 0, "heads_eligible": 0}),
    )


def _layout_and_memory(options: CaptureOptions, config, device: str, dtype: str, gpus: int | None) -> dict:
    """The heads sampled and the expected peak memory (weights counted on the meta device), as plan fields."""
    from qkplast.capture.architecture import architecture_from_config
    from qkplast.capture.models import MULTI_GPU
    from qkplast.capture.sampling import sample_heads

    layout = architecture_from_config(config)
    heads = sample_heads(layout, options.heads, options.seed)
    n_params = _parameter_count(config)
    per = _BYTES[dtype]
    spread = max(1, gpus if gpus is not None else _visible_gpus()) if device == MULTI_GPU else 1
    bytes_per_token = activation_bytes_per_token(config, dtype, device)
    weights_gb = n_params * per / _GB / spread
    activations_gb = bytes_per_token * options.seq_len / _GB
    logits_gb = logits_pass_gb(config, options.seq_len, dtype)
    overhead = CUDA_OVERHEAD_GB if device.startswith("cuda") else 0.0
    return dict(heads=len(heads), heads_eligible=heads.n_eligible, eligible_layers=layout.eligible_layers,
                excluded_layers=layout.excluded(), n_params=n_params, weights_gb=weights_gb,
                activations_gb=activations_gb, peak_gb=weights_gb + max(activations_gb, logits_gb) + overhead,
                bytes_per_token=bytes_per_token, logits_gb=logits_gb, gpus=spread)


@dataclass(frozen=True)
class _Counted:
    """One pass over a corpus: the windows found, and what the plan keeps of it."""

    found: int | None = None
    tokenizer: object = None
    corpus: object = None
    kept: list | None = None
    stats: object = None
    tokenizer_info: dict | None = None


def _windows(options: CaptureOptions, documents, tokenizer, keep: bool) -> _Counted:
    """Cut the corpus into at most ``options.docs`` windows, once: counted, and kept when ``keep``.

    The windows a capture reads are these same ones (same documents, tokenizer, ``seq_len`` and policy, stopped
    at ``docs``), so the statistics of this pass are the ones the capture records.
    """
    import itertools

    from qkplast.capture.corpus import WindowStats, iter_windows, open_corpus_for
    from qkplast.capture.models import tokenizer_for

    documents = open_corpus_for(options) if documents is None else documents
    tokenizer, tokenizer_info = tokenizer_for(options, with_info=True) if tokenizer is None else (tokenizer, None)
    stats = WindowStats()
    windows = itertools.islice(
        iter_windows(documents, tokenizer, options.seq_len, short_docs=options.short_docs, stats=stats), options.docs)
    kept = list(windows) if keep else None
    found = len(kept) if keep else sum(1 for _ in windows)
    return _Counted(found, tokenizer, documents, kept, stats, tokenizer_info)


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _planned_device(device: str) -> str:
    """The device a plan is for: ``auto`` is CUDA when a GPU is visible; a named device need not exist here."""
    import torch

    from qkplast.capture.models import ModelError, primary_device

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(primary_device(device))
    except RuntimeError as exc:
        raise ModelError(f"bad device {device!r}: {str(exc).splitlines()[0]}") from None
    return device


# --------------------------------------------------------------------------- the second corpus (notebook 09's code)

#: Fewest windows the code capture is made with: its bootstrap over documents needs two.
MIN_CODE_WINDOWS = 2
#: Times the window is halved, at most, when the code corpus has too few windows at the run's length.
CODE_HALVINGS = 3


@dataclass(frozen=True)
class CodeCapture:
    """How the capture of a second corpus beside the run's (notebook 09's code) is sized, and why.

    Attributes
    ----------
    options : CaptureOptions or None
        The capture to make: the run's settings on the second corpus, with fewer or shorter windows when the
        corpus cannot fill the run's; None when it is skipped.
    status : {"as-run", "fewer", "shorter", "same-corpus", "skipped"}
        ``as-run``: the run's windows; ``fewer``/``shorter``: sized down (stated in ``note``);
        ``same-corpus``: the second corpus is the run's own (no duplicate capture); ``skipped``: it cannot
        fill two windows even at an eighth of the run's length.
    note : str
        One sentence for the manifest, ``--dry-run`` and chapter 09.
    """

    options: CaptureOptions | None
    status: str
    note: str

    def to_dict(self) -> dict:
        return {"options": None if self.options is None else self.options.to_dict(), "status": self.status,
                "note": self.note}

    @classmethod
    def from_dict(cls, record: dict) -> "CodeCapture":
        options = record.get("options")
        return cls(None if options is None else CaptureOptions(**options), record["status"], record["note"])


def _same_corpus(a: CaptureOptions, b: CaptureOptions) -> bool:
    from pathlib import Path

    def key(o):
        path = Path(o.corpus)
        return (str(path.resolve()) if path.exists() else o.corpus, o.text_field, o.id_field)

    return key(a) == key(b)


def _windows_by_length(documents, tokenizer, wanted: CaptureOptions):
    """``windows_at(seq_len)``: the windows of ``seq_len`` tokens the corpus yields under ``wanted.short_docs``, at
    most ``wanted.docs``, as :func:`qkplast.capture.corpus.count_windows` counts them, from one tokenization.

    The documents are encoded in growing batches until the run's own length (``wanted.seq_len``) finds its
    ``docs`` windows, which is all a run whose corpus fills it reads; otherwise the whole corpus is encoded once,
    and every shorter length is counted from the same token lengths
    (:func:`qkplast.capture.corpus.windows_of_lengths`), not by encoding the corpus again for each.
    """
    import numpy as np

    from qkplast.capture.corpus import length_batches, prefix_tokens, windows_of_lengths

    prefix = len(prefix_tokens(tokenizer))
    lengths = np.zeros(0, dtype=np.int64)  # [document read]

    def count(seq_len: int) -> int:
        found = windows_of_lengths(lengths, seq_len - prefix, wanted.short_docs) if seq_len > prefix else 0
        return found if wanted.docs is None else min(found, wanted.docs)

    for batch in length_batches(documents, tokenizer):
        lengths = np.concatenate([lengths, batch])
        if wanted.docs is not None and count(wanted.seq_len) >= wanted.docs:
            break  # the run's own length is filled: the capture reads no further, and no shorter one is asked
    return count


def size_code_capture(main: CaptureOptions, corpus: str, tokenizer=None) -> CodeCapture:
    """The capture of ``corpus`` beside the run ``main``, sized to what that corpus yields (tokenizer only).

    The run's settings are kept where the corpus fills them; otherwise the capture takes the windows the
    corpus yields (at least :data:`MIN_CODE_WINDOWS`), and when even that fails the window is halved (the
    buckets with it, so there are as many) up to :data:`CODE_HALVINGS` times. A corpus that fills no two
    windows is skipped, and so is the run's own corpus (the capture would duplicate the run's). Nothing
    here raises for the corpus: the second capture never stops the run.

    Parameters
    ----------
    main : CaptureOptions
        The run's capture (``seq_len`` and ``bucket_size`` may be None: resolved from the config).
    corpus : str
        The second corpus (notebook 09's ``code_corpus``); read with ``main``'s text and id fields.
    tokenizer : optional
        The run's tokenizer (loaded from ``main`` when omitted).
    """
    from qkplast.capture.corpus import CorpusError, open_corpus_for
    from qkplast.capture.models import load_config, tokenizer_for

    wanted = replace(main, corpus=corpus)
    if _same_corpus(main, wanted):
        return CodeCapture(None, "same-corpus", f"the code corpus {corpus!r} is the run's own corpus: no second "
                                                "capture (it would duplicate the run's), no prose/code comparison")
    if main.seq_len is None or main.bucket_size is None:
        config, _ = load_config(main.model, revision=main.revision, rope_scaling=main.rope_scaling)
        wanted = _resolve_lengths(wanted, config)
    if tokenizer is None:
        tokenizer = tokenizer_for(main)
    try:
        documents = open_corpus_for(wanted)
    except CorpusError as exc:
        return CodeCapture(None, "skipped", f"the code capture is skipped: {exc}")
    seq_len, bucket = wanted.seq_len, wanted.bucket_size
    windows_at = _windows_by_length(documents, tokenizer, wanted)
    for halving in range(CODE_HALVINGS + 1):
        length, width = seq_len >> halving, max(1, bucket >> halving)
        if length < 2 or width > length:
            break
        trial = replace(wanted, seq_len=length, bucket_size=width,
                        samples_per_bucket=min(wanted.samples_per_bucket, float(width)))
        found = windows_at(length)
        need = min(MIN_CODE_WINDOWS, wanted.docs or MIN_CODE_WINDOWS)
        if found < need:
            continue
        sized = replace(trial, docs=found if wanted.docs is None or found < wanted.docs else wanted.docs)
        if halving == 0 and sized.docs == wanted.docs:
            return CodeCapture(sized, "as-run", f"code capture: {sized.docs} windows of {length} tokens of "
                                                f"{corpus}, as the run's")
        status = "fewer" if halving == 0 else "shorter"
        return CodeCapture(sized, status, (
            f"code capture sized to what {corpus!r} yields: {sized.docs} windows of {length} tokens "
            f"(buckets of {width})" + ("" if wanted.docs is None else f", where the run has {wanted.docs} of "
                                                                       f"{seq_len}")))
    return CodeCapture(None, "skipped", (
        f"the code capture is skipped: {corpus!r} yields fewer than {MIN_CODE_WINDOWS} windows of "
        f"{seq_len >> CODE_HALVINGS} tokens or more with short_docs={wanted.short_docs!r}, "
        "so notebook 09 has no prose/code comparison for this run"))
