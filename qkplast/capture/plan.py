"""Plan a capture from the config alone: windows, heads, expected peak memory, and whether it fits.

:func:`plan_capture` reads only the model's config and tokenizer (no weight)
and the corpus (tokenized, not run), and predicts

* the windows the corpus yields for the options (:func:`qkplast.capture.corpus.count_windows`);
* the heads sampled: the layout predicted from the config
  (:func:`qkplast.capture.architecture.layout_from_config`) and the same draw as the capture
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

:meth:`CapturePlan.check` refuses a plan whose kernel needs ``seq_len^2``
memory (:mod:`qkplast.capture.kernel_guard`), whose corpus is too short, or whose peak
exceeds the device's memory. ``str(plan)`` is a readable table.

:func:`preflight` is the part :func:`qkplast.capture.driver.run_capture` runs before
it loads any weight.
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
    "plan_capture",
    "preflight",
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


def live_elements_per_token(config) -> int:
    """Elements per token live at the peak of a decoder forward (no cache, no LM head); see the module doc.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The (text) config: ``hidden_size``, ``intermediate_size``, head counts and ``head_dim``.
    """
    text = config.get_text_config()
    h, i = int(text.hidden_size), int(text.intermediate_size)
    n_q = int(text.num_attention_heads)
    n_kv = int(getattr(text, "num_key_value_heads", None) or n_q)
    d = int(getattr(text, "head_dim", None) or h // n_q)
    base = 2 * h + 2 * d  # residual stream, embedding output, RoPE cos and sin
    attention = h + 2 * (n_q + 2 * n_kv) * d + n_q * d + h  # normed input, q/k/v pre and post RoPE, kernel out, o_proj
    mlp = h + 3 * i + h  # normed input, gate, up, act(gate) * up, down
    return base + max(attention, mlp)


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
        Expected peak = weights + activations (+ CUDA overhead on a GPU).
    bytes_per_token : float
        Activation bytes per token (``KAPPA x E x bytes``).
    device_memory_gb : float or None
        Memory of the device, given or detected.
    kernel_problem : str or None
        Why the attention kernel would need ``seq_len^2`` memory (:func:`qkplast.capture.kernel_guard.kernel_problem`).
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

    def problems(self) -> list[str]:
        """One line per reason the capture cannot run as planned."""
        found = []
        if self.kernel_problem:
            found.append(self.kernel_problem)
        if self.windows is not None and self.windows_wanted is not None and self.windows < self.windows_wanted:
            found.append(
                f"corpus {self.options.corpus!r} yields {self.windows} window(s) of {self.options.seq_len} tokens but "
                f"{self.windows_wanted} were asked for; pass a corpus of longer documents, fewer --docs or a shorter "
                "--seq-len"
            )
        if self.device_memory_gb is not None and self.peak_gb > self.device_memory_gb:
            found.append(
                f"expected peak memory {self.peak_gb:.1f} GiB exceeds the {self.device_memory_gb:.1f} GiB of "
                f"{self.device}; use a shorter --seq-len, --dtype bfloat16, or a larger device"
            )
        return found

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
            ("weights", f"{self.weights_gb:.2f} GiB"),
            ("activations", f"{self.activations_gb:.2f} GiB ({self.bytes_per_token:.0f} B/token x {o.seq_len})"),
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

    n_q, n_kv = _heads(config)
    return kernel_problem(options.attn, dtype, device.split(":")[0], device_capability(device), options.seq_len,
                          n_q, n_kv)


def _count_windows(documents, tokenizer, options: CaptureOptions, strict: bool) -> int | None:
    from qkplast.capture import corpus as corpus_module

    count = getattr(corpus_module, "count_windows", None)
    if count is None:  # older corpus module: nothing to count with
        return None
    return count(documents, tokenizer, options, strict=strict)


def preflight(options: CaptureOptions, documents, tokenizer=None) -> CaptureOptions:
    """Everything :func:`qkplast.capture.driver.run_capture` checks before loading weights; returns resolved options.

    The config (revision resolved offline, RoPE override applied) bounds
    ``seq_len``; the kernel guard runs on the config's head counts; the
    tokenizer alone (``options.tokenizer``, else the model's own) counts the
    corpus's windows (raising when there are fewer than ``options.docs``).
    """
    from qkplast.capture.kernel_guard import KernelError
    from qkplast.capture.models import check_seq_len, load_config, load_tokenizer, resolve_device, resolve_dtype

    config, info = load_config(options.model, revision=options.revision, rope_scaling=options.rope_scaling)
    options = _resolve_lengths(options, config)
    check_seq_len(config, options.seq_len, rope_scaling=info["rope_scaling"])
    device = resolve_device(options.device)
    problem = _kernel_problem(options, config, device, resolve_dtype(options.dtype, device))
    if problem is not None:
        raise KernelError(problem)
    if tokenizer is None:
        tokenizer = load_tokenizer(options.model, revision=options.revision, tokenizer=options.tokenizer)
    _count_windows(documents, tokenizer, options, strict=True)
    return options


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
        return torch.cuda.get_device_properties(torch.device(device)).total_memory / _GB
    if device == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _GB
        except (ValueError, OSError):
            return None
    return None


def plan_capture(options: CaptureOptions, *, device_memory_gb: float | None = None) -> CapturePlan:
    """Plan the capture ``options`` describe, from the config, tokenizer and corpus alone (no weights).

    Parameters
    ----------
    options : CaptureOptions
        ``model`` may be ``owner/name@revision``; ``device="auto"`` plans for
        CUDA when a GPU is visible.
    device_memory_gb : float, optional
        Memory of the target device in GiB (default: detected, the GPU's or the host's).

    Returns
    -------
    CapturePlan
        Print it for the table; :meth:`CapturePlan.check` raises when it cannot run.
    """
    from qkplast.capture.corpus import open_corpus_for
    from qkplast.capture.architecture import layout_from_config
    from qkplast.capture.models import load_config, load_tokenizer, resolve_dtype
    from qkplast.capture.sampling import sample_heads

    config, info = load_config(options.model, revision=options.revision, rope_scaling=options.rope_scaling)
    options = _resolve_lengths(options, config)
    device = _planned_device(options.device)
    dtype = str(resolve_dtype(options.dtype, device)).removeprefix("torch.")
    layout = layout_from_config(config)
    heads = sample_heads(layout, options.heads, options.seed)
    documents = open_corpus_for(options)
    tokenizer = load_tokenizer(options.model, revision=options.revision, tokenizer=options.tokenizer)
    windows = _count_windows(documents, tokenizer, options, strict=False)
    n_params = _parameter_count(config)
    per = _BYTES[dtype]
    n_q = int(config.get_text_config().num_attention_heads)
    bytes_per_token = KAPPA * live_elements_per_token(config) * per + (4 * n_q if device.startswith("cuda") else 0)
    weights_gb = n_params * per / _GB
    activations_gb = bytes_per_token * options.seq_len / _GB
    overhead = CUDA_OVERHEAD_GB if device.startswith("cuda") else 0.0
    return CapturePlan(
        options=options,
        commit=info.get("commit"),
        device=device,
        dtype=dtype,
        windows=windows,
        windows_wanted=options.docs,
        heads=len(heads),
        heads_eligible=heads.n_eligible,
        eligible_layers=layout.eligible_layers,
        excluded_layers=layout.excluded(),
        n_params=n_params,
        weights_gb=weights_gb,
        activations_gb=activations_gb,
        peak_gb=weights_gb + activations_gb + overhead,
        bytes_per_token=bytes_per_token,
        device_memory_gb=device_memory_gb if device_memory_gb is not None else _device_memory_gb(device),
        kernel_problem=_kernel_problem(options, config, device, dtype),
    )


def _planned_device(device: str) -> str:
    """The device a plan is for: ``auto`` is CUDA when a GPU is visible; a named device need not exist here."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device
