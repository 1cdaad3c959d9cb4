"""The two option objects passed whole through the package: capture settings and analysis choices.

:class:`CaptureOptions` holds every setting of one capture (thesis section 4.1);
:class:`AnalysisOptions` every choice the thesis leaves open, with its documented
default (sections 4.2-4.4), each alternative being a reading a careful reader could
also defend, so runs can show how much a result depends on it. Field annotations
are the single source of each option's type and choices: ``Literal[...]`` fields
take one of their values, ``tuple[int, ...]`` fields comma-separated values, and
the command line's flags are generated from them (:mod:`qkplast.pipeline.flags`).
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Literal, NamedTuple

from qkplast.errors import ModelError, QkplastError


class OptionsError(QkplastError):
    """An option value is out of range or of the wrong type."""


class UnknownOptionError(QkplastError, TypeError):
    """An option name that the options class does not have (a TypeError too, as for a bad keyword)."""


EXECUTION_OPTIONS = ("device", "head_chunk")

__all__ = ["AnalysisOptions", "CaptureOptions", "FieldSpec", "OptionsError", "PRESETS", "UnknownOptionError",
           "coerce", "field_spec", "parse_rope_scaling", "split_revision", "typed_option"]


@dataclass(frozen=True)
class AnalysisOptions:
    """Options of :func:`qkplast.analyze`.

    PCA and taxonomy (section 4.2)
    ------------------------------
    taxonomy_low, taxonomy_high : float
        Thresholds on ``|r_q^(0)|``, ``|r_k^(0)|`` (0.3 / 0.7 in the thesis).

    Plasticity (section 4.4)
    ------------------------
    n_pairs : int
        Key pairs per query bucket (256). When a bucket has at most ``n_pairs``
        admissible pairs, all of them are used (the exact average); otherwise
        ``n_pairs`` are drawn uniformly with replacement.
    query_position : {"midpoint", "mean"}
        Representative position tau of a query bucket: its midpoint
        ``(j + 1/2) * bucket_size`` (thesis, 4.4.3) or the mean position of the
        bucket's captured queries.
    semantic_stats : {"per_bucket", "global"}
        Semantic mean and variance of query coordinates 2..d per query bucket
        (mu_b, sigma_b^2 of eq. 4.11-4.12; default) or pooled over all queries.
    positional_fit : {"global", "per_bucket"}
        Coordinate 1 modelled by the global linear fit ``alpha_pos + beta_pos tau``
        with residual variance ``sigma_pos^2`` (eq. 4.11-4.12; default), or by the
        mean and variance of coordinate 1 among the bucket's own queries, which
        also absorbs the spread of positions inside a bucket.
    covariance : {"diagonal", "full", "joint"}
        ``diag(Sigma_b)`` as in eq. 4.12 (default); the full semantic covariance
        Sigma_b as in the proof of Lemma A.1; or the full covariance of all d
        rotated coordinates in the bucket, which drops the assumption that the
        positional residual is independent of the semantic coordinates
        ("joint" needs ``positional_fit="per_bucket"`` and
        ``semantic_stats="per_bucket"``).
    eligible_keys : {"earlier_buckets", "before_query"}
        Keys from buckets strictly before the query bucket (4.4.5; default) or
        every key whose position is below tau.
    pair_docs : {"same", "any"}
        Both keys of a pair from the same document (a prefix is one document,
        Definition 4.3; default) or from any documents.
    bucket_weight : {"tokens", "samples", "uniform"}
        Weights of query buckets in ``ap_overall``: bucket width in tokens (the
        thesis's "bucket-size-weighted mean"; default), number of captured
        queries, or equal.
    edge_fraction : float
        "First/last 20%" of the context: 0.2.
    edge_rule : {"position", "bucket_index"}
        A bucket is in the first (last) part when ``tau / seq_len < edge_fraction``
        (``>= 1 - edge_fraction``) (default), or by index: the first (last)
        ``ceil(edge_fraction * n_buckets)`` buckets.
    min_bucket_samples : int
        Fewest queries a bucket needs for its statistics (2); fewer gives NaN
        with a warning naming the bucket.
    mc_unbiased : bool
        Monte Carlo plasticity from ``n`` queries uses ``4 p (1-p) n/(n-1)``,
        the unbiased estimate of ``4 p (1-p)`` (default True).
    context_bins : int
        Equal bins of ``tau / seq_len`` for the profile ``ap_context`` (5: the
        quintiles of Table 6.1).
    map_bins : int
        Bins per axis of the 2D plasticity map (inter-key distance by
        query-to-key-midpoint distance, section 4.4.5).
    seed : int
        Seed of the key-pair draw.

    Execution
    ---------
    device : str
        ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda"``.
    head_chunk : int
        Heads processed together; 0 (default) sizes chunks so that the largest
        temporary (the key differences, ``[head, bucket, pair, dim]``) stays near
        16 MB on the CPU, below glibc's largest mmap threshold, so buffers are
        reused instead of being mapped and zero-filled afresh (measured 2-4x
        faster than 32-head chunks here), and near 1 GB on a GPU. The thesis
        metrics of :func:`qkplast.analyze` and :func:`qkplast.analysis.plasticity.plasticity`
        keep those temporaries in per-thread scratch buffers and use 64 MB (192 MB with the listwise
        plasticity, ``open_questions``).

    Added later (plasticity, section 4.4)
    -------------------------------------
    pair_weight : {"uniform", "prefix"}
        How the key pairs of a query bucket are averaged into ``ap``. "uniform"
        (default, the thesis's estimator, 4.4.5): every admissible pair of the
        earlier buckets counts the same. "prefix": Definition 4.3's weighting.
        There the prefix length N is uniform on ``{1, ..., t-1}`` and the pair
        uniform among the ``C(N, 2)`` pairs of the prefix, so a pair whose later
        key sits at (1-indexed) position ``j`` has probability proportional to
        ``sum_{N=j}^{t-1} 1/C(N, 2) = 2 (1/(j-1) - 1/(t-1))``: pairs of early keys
        weigh far more. With ``t = tau + 1`` (tau is 0-indexed) the weight of a
        sampled pair is ``1/(j-1) - 1/(t-1)``, normalised within the bucket
        (an importance weight on the uniformly drawn pairs). The two estimate
        different quantities; neither is a correction of the other.

    Beyond the thesis (listwise plasticity, :mod:`qkplast.analysis.listwise`)
    -------------------------------------------------------------------------
    set_sizes : tuple of int
        Key-set sizes m of ``ap_set`` ((2, 8, 64, 0)); 0 is the whole
        eligible set of a document. m = 2 uses the pairwise estimator's pairs.
    n_sets : int
        Key sets drawn per query bucket and set size (16; m = 2 uses the ``n_pairs`` pairs).
    n_model_queries : int
        Queries drawn from the fitted Gaussian model per bucket for ``ap_set``
        at m > 2, where no closed form exists (32, as many as a default
        bucket captures).
    open_questions : bool
        Compute the per-head metrics of the chapter "Beyond the thesis: open
        questions" in :func:`qkplast.analyze` (listwise plasticity, the
        ``AP_drop`` decomposition; default True). They cost several times the
        thesis's own metrics (``benchmarks/bench_plasticity.py`` prints both);
        False leaves them out.

    Model families beyond the thesis's (:func:`qkplast.analysis.vectors.analysis_vectors`)
    --------------------------------------------------------------------------------------
    head_dims : {"all", "rotary", "non_rotary"}
        Which dimensions of each head are analysed. "all" (default): the whole
        vector, as the kernel scores it (``q . k`` sums over every dimension).
        "rotary": only the dimensions the rotary embedding turns (the capture's
        ``rotary`` coordinate on ``dim``); "non_rotary": only the others, which
        carry no rotary position. GPT-NeoX (Pythia, ``rotary_pct = 0.25``)
        turns the first quarter of each head; in every other supported family
        all dimensions turn, so "rotary" equals "all" there and "non_rotary"
        is refused.
    query_scale : {"as_captured", "divided_out"}
        The position-dependent query scale of Ministral-3 (Llama-4 style,
        ``1 + beta log(1 + floor(t / original))``, up to 1.21 at 128K), which
        multiplies the queries before the kernel. "as_captured" (default): the
        queries as the kernel receives them, scale included, because the
        plasticity of a head is a property of the scores the model computes.
        "divided_out": each query divided by its position's factor (the
        capture's ``query_scale`` coordinate), the geometry of the rotary
        embedding alone. A capture without the coordinate (every family but
        Ministral-3) has factor 1: both choices give the same result.
    """

    taxonomy_low: float = 0.3
    taxonomy_high: float = 0.7
    n_pairs: int = 256
    query_position: Literal["midpoint", "mean"] = "midpoint"
    semantic_stats: Literal["per_bucket", "global"] = "per_bucket"
    positional_fit: Literal["global", "per_bucket"] = "global"
    covariance: Literal["diagonal", "full", "joint"] = "diagonal"
    eligible_keys: Literal["earlier_buckets", "before_query"] = "earlier_buckets"
    pair_docs: Literal["same", "any"] = "same"
    bucket_weight: Literal["tokens", "samples", "uniform"] = "tokens"
    edge_fraction: float = 0.2
    edge_rule: Literal["position", "bucket_index"] = "position"
    min_bucket_samples: int = 2
    mc_unbiased: bool = True
    context_bins: int = 5
    map_bins: int = 16
    seed: int = 0
    device: str = "auto"
    head_chunk: int = 0
    pair_weight: Literal["uniform", "prefix"] = "uniform"
    set_sizes: tuple[int, ...] = (2, 8, 64, 0)
    n_sets: int = 16
    n_model_queries: int = 32
    open_questions: bool = True
    head_dims: Literal["all", "rotary", "non_rotary"] = "all"
    query_scale: Literal["as_captured", "divided_out"] = "as_captured"

    def __post_init__(self):
        _coerce_fields(self)
        if any(m < 0 or m == 1 for m in self.set_sizes) or len(set(self.set_sizes)) != len(self.set_sizes):
            raise OptionsError(f"option set_sizes must be distinct sizes >= 2 (or 0 for the whole set), got {self.set_sizes}")
        if self.n_sets < 1 or self.n_model_queries < 2:
            raise OptionsError(f"options n_sets >= 1 and n_model_queries >= 2 needed, got {self.n_sets}, {self.n_model_queries}")
        if not 0 <= self.taxonomy_low <= self.taxonomy_high <= 1:
            raise OptionsError("taxonomy thresholds need 0 <= taxonomy_low <= taxonomy_high <= 1")
        if not 0 < self.edge_fraction <= 0.5:
            raise OptionsError(f"edge_fraction must lie in (0, 0.5], got {self.edge_fraction}")
        if self.head_chunk < 0:
            raise OptionsError(f"option head_chunk must be >= 0 (0 = automatic), got {self.head_chunk}")
        for name in ("n_pairs", "context_bins", "map_bins"):
            if int(getattr(self, name)) < 1:
                raise OptionsError(f"option {name} must be >= 1, got {getattr(self, name)}")
        if self.min_bucket_samples < 2:
            raise OptionsError("min_bucket_samples must be >= 2: a variance needs two samples")
        if self.covariance == "joint" and (self.positional_fit, self.semantic_stats) != ("per_bucket", "per_bucket"):
            raise OptionsError(
                'covariance="joint" models all coordinates from the bucket\'s own queries; '
                'it needs positional_fit="per_bucket" and semantic_stats="per_bucket"'
            )

    @classmethod
    def from_kwargs(cls, options: "AnalysisOptions | None" = None, **overrides) -> "AnalysisOptions":
        """Options from an optional base plus keyword overrides; unknown names are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise UnknownOptionError(f"unknown analysis option(s) {unknown}; valid options: {sorted(names)}")
        return replace(options or cls(), **overrides)

    def to_dict(self) -> dict:
        # tuples as lists: the form they take after a JSON round trip through a saved dataset's attrs
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def result_key(self) -> dict:
        """The options that can change results: all but the execution ones (``device``, ``head_chunk``)."""
        return {k: v for k, v in self.to_dict().items() if k not in EXECUTION_OPTIONS}


# --------------------------------------------------------------------------- capture

#: Capture settings that cannot change what is captured (only where and how fast).
CAPTURE_EXECUTION_OPTIONS = ("device",)


@dataclass(frozen=True)
class CaptureOptions:
    """Settings of one capture (thesis section 4.1): the single source for
    :func:`qkplast.capture.driver.capture`, ``qkplast capture``, ``qkplast run``, the
    run manifest and the capture attrs, all under these names.

    Model
    -----
    model : str
        ``smollm2-135m`` (embedded), a local checkpoint directory, or a hub id,
        optionally ``owner/name@revision``: the revision is split off into
        ``revision`` here, once, so every reader sees ``model`` without it.
    revision : str or None
        Hub revision (branch, tag or commit); ``model@revision`` sets it too.
    tokenizer : str or None
        Where the tokenizer comes from: ``owner/name@revision`` (pin it with a
        40-hex commit), ``owner/name`` or a local directory; None (default):
        the model's own, at the model's revision. For checkpoint branches that
        ship no tokenizer (SmolLM3's), name the base model's.
    rope_scaling : str or None
        RoPE override ``TYPE:FACTOR[:ORIGINAL]``, e.g. ``yarn:4:32768`` (5.4.2).
    device : str
        ``auto``, ``cpu``, ``cuda``, ``cuda:N``, or ``cuda:all`` (the weights spread over every visible GPU,
        for a model larger than one).
    dtype : {"auto", "float32", "bfloat16", "float16"}
        Compute dtype; ``auto`` is bf16 on a GPU and fp32 on the CPU.
    attn : {"sdpa", "eager"}
        Kernel the capture hook delegates to.
    allow_unverified : bool
        Capture model families outside the verified ones.

    Corpus and windows
    ------------------
    corpus : str
        Corpus specification (see :func:`qkplast.capture.corpus.open_corpus`).
    docs : int or None
        Document windows to capture (None: all the corpus yields).
    seq_len : int or None
        Tokens per window (None: the model's maximum, at most 131072).
    short_docs : {"concat", "skip"}
        Documents shorter than ``seq_len``: concatenated with EOS, or skipped.
    text_field, id_field : str
        Fields of ``.jsonl`` records and dataset rows.

    Sampling (section 4.1)
    ----------------------
    bucket_size : int or None
        Position bucket width (None: ``seq_len // 16``).
    samples_per_bucket : float
        Expected samples per bucket per document.
    min_per_bucket : int
        Guaranteed samples per bucket per document (0 as in the thesis).
    heads : int or None
        Query heads sampled (300 as in the thesis; None: all).
    seed : int
        Seed of head and position sampling.

    The defaults are the embedded default run, the thesis's setting in
    miniature: SmolLM2-135M across its whole trained window (8192 tokens, 16
    buckets of 512), on single long documents of the CPython documentation
    (``python-docs``, documents shorter than the window skipped, never
    concatenated), 4 documents x 8 expected samples per bucket = 32 queries per
    bucket. :data:`PRESETS` holds a shorter setting for fast tests.
    """

    model: str = "smollm2-135m"
    revision: str | None = None
    tokenizer: str | None = None
    rope_scaling: str | None = None
    device: str = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn: Literal["sdpa", "eager"] = "sdpa"
    allow_unverified: bool = False
    corpus: str = "python-docs"
    docs: int | None = 4
    seq_len: int | None = 8192
    short_docs: Literal["skip", "concat"] = "skip"
    text_field: str = "text"
    id_field: str = "id"
    bucket_size: int | None = 512
    samples_per_bucket: float = 8.0
    min_per_bucket: int = 0
    heads: int | None = 300
    seed: int = 0

    def __post_init__(self):
        _coerce_fields(self)
        model, revision = split_revision(self.model, self.revision)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "revision", revision)
        for name in ("docs", "seq_len", "bucket_size", "heads"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise OptionsError(f"capture option {name} must be >= 1 or None, got {value}")
        if self.samples_per_bucket <= 0:
            raise OptionsError(f"capture option samples_per_bucket must be > 0, got {self.samples_per_bucket}")
        if self.min_per_bucket < 0:
            raise OptionsError(f"capture option min_per_bucket must be >= 0, got {self.min_per_bucket}")
        if self.seq_len is not None and self.bucket_size is not None and self.bucket_size > self.seq_len:
            raise OptionsError(f"bucket_size {self.bucket_size} exceeds seq_len {self.seq_len}; pick a smaller --bucket-size")

    @classmethod
    def from_kwargs(cls, options: "CaptureOptions | None" = None, **overrides) -> "CaptureOptions":
        """Options from an optional base plus keyword overrides; unknown names are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise UnknownOptionError(f"unknown capture option(s) {unknown}; valid options: {sorted(names)}")
        return replace(options or cls(), **overrides)

    def to_dict(self) -> dict:
        return asdict(self)

    def result_key(self) -> dict:
        """The options that can change what is captured: all but ``device``."""
        return {k: v for k, v in asdict(self).items() if k not in CAPTURE_EXECUTION_OPTIONS}



# --------------------------------------------------------------------------- typed values


class FieldSpec(NamedTuple):
    """What an option field accepts, read from its annotation."""

    kinds: tuple[type, ...]  # value types, in the order text is tried against them
    nullable: bool = False  # None allowed
    choices: tuple | None = None  # Literal values
    item: type | None = None  # element type of a tuple field

    def describe(self) -> str:
        if self.item is not None:
            return f"comma-separated {self.item.__name__} values such as 2,8"
        return " or ".join(k.__name__ for k in self.kinds) + (" or none" if self.nullable else "")


@functools.cache
def field_spec(cls, name: str) -> FieldSpec:
    """The :class:`FieldSpec` of field ``name`` of an options dataclass, from its resolved annotation."""
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    nullable = typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) < len(typing.get_args(hint))
    if typing.get_origin(hint) is Literal:
        return FieldSpec((str,), False, tuple(typing.get_args(hint)))
    if typing.get_origin(hint) is tuple:
        return FieldSpec((tuple,), False, None, args[0] if args else str)
    kinds = tuple(args) if nullable else (hint,)
    return FieldSpec(kinds, nullable)


def _parse_text(spec: FieldSpec, text: str, name: str):
    """``text`` from a command line as one of the field's kinds; raises naming the option."""
    low = text.strip().lower()
    if spec.nullable and low in ("none", "null", "all", ""):
        return None
    for kind in spec.kinds:
        if kind is bool:
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
        elif kind is str:
            return text
        else:
            try:
                number = float(text)
            except ValueError:
                continue
            if kind is int and not number.is_integer():
                continue
            return kind(number)
    raise OptionsError(f"option {name} expects {spec.describe()}, got {text!r}")


def _tuple_value(spec: FieldSpec, value, name: str) -> tuple:
    """A tuple field's value: ``"2,8"``, ``"(2, 8)"``, a list or tuple, or one number; each item typed."""
    if isinstance(value, str):
        text = value.strip().strip("()[]")
        items = [t.strip() for t in text.split(",")] if text else []
        if any(t == "" for t in items):
            raise OptionsError(f"option {name} expects {spec.describe()}, got {value!r}")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        items = [value]
    else:
        raise OptionsError(f"option {name} expects {spec.describe()}, got {value!r}")
    item = FieldSpec((spec.item,))
    try:
        return tuple(coerce(v, item, name) for v in items)
    except OptionsError:
        raise OptionsError(f"option {name} expects {spec.describe()}, got {value!r}") from None


def coerce(value, spec: FieldSpec, name: str):
    """``value`` (text from a command line, a literal, or a JSON round trip) as the field's type.

    Raises
    ------
    OptionsError
        The value is not of the field's type or not one of its choices; the message names option, value and type.
    """
    if spec.item is not None:
        return _tuple_value(spec, value, name)
    if isinstance(value, str) and spec.choices is None:
        return _parse_text(spec, value, name)
    if spec.choices is not None:
        if value not in spec.choices:
            raise OptionsError(f"option {name}={value!r} is not one of {spec.choices}")
        return value
    if value is None and spec.nullable:
        return value
    for kind in spec.kinds:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
    raise OptionsError(f"option {name} expects {spec.describe()}, got {value!r} ({type(value).__name__})")


def _coerce_fields(options) -> None:
    """Convert every field of a frozen options object to its annotated type, or raise naming the field.

    A tuple field becomes a tuple whatever came in (a list from a saved dataset's JSON attrs), so saved
    options compare equal to fresh ones.
    """
    for f in fields(options):
        object.__setattr__(options, f.name, typed_option(type(options), f.name, getattr(options, f.name)))


def typed_option(cls, name: str, value):
    """``value`` converted to the type of field ``name`` of ``cls`` (``CaptureOptions`` or ``AnalysisOptions``)."""
    return coerce(value, field_spec(cls, name), name)


def split_revision(spec: str, revision: str | None = None) -> tuple[str, str | None]:
    """Split ``owner/name@revision`` into ``(name, revision)``.

    An existing local path is never split (a directory may contain ``@``).
    An explicit ``revision`` agreeing with the one in ``spec`` (or given
    alone) wins; two different revisions are an error. :class:`CaptureOptions`
    calls this once, so its ``model`` never carries a revision.

    Raises
    ------
    ModelError
        ``spec`` and ``revision`` name different revisions, or the revision after ``@`` is empty.
    """
    name, at = spec, None
    if "@" in spec and not Path(spec).expanduser().exists():
        name, at = spec.rsplit("@", 1)
        if not at or not name:
            raise ModelError(f"bad model {spec!r}: expected NAME@REVISION with both parts non-empty")
    if at is not None and revision is not None and at != revision:
        raise ModelError(
            f"model {spec!r} names revision {at!r} but --revision is {revision!r}; give the revision once"
        )
    return name, revision if revision is not None else at


#: The RoPE scaling types a ``--rope-scaling`` override may name.
_ROPE_TYPES = ("yarn", "linear", "dynamic")


def parse_rope_scaling(spec: str | dict | None) -> dict | None:
    """Parse a RoPE scaling override ``TYPE:FACTOR[:ORIGINAL_MAX_POSITIONS]``.

    ``yarn:4:32768`` is the thesis's Qwen3 setting (section 5.4.2). A dict is
    returned unchanged (after checking it names a type and a factor).

    Returns
    -------
    dict or None
        ``{"rope_type", "factor"[, "original_max_position_embeddings"]}``.
    """
    if spec is None or isinstance(spec, dict):
        if isinstance(spec, dict) and not {"rope_type", "factor"} <= set(spec):
            raise ModelError(f"a RoPE scaling dict needs 'rope_type' and 'factor', got {sorted(spec)}")
        return spec
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[0] not in _ROPE_TYPES:
        raise ModelError(
            f"bad --rope-scaling {spec!r}: expected TYPE:FACTOR[:ORIGINAL_MAX_POSITIONS] with TYPE one of "
            f"{', '.join(_ROPE_TYPES)}, e.g. yarn:4:32768"
        )
    try:
        factor = float(parts[1])
        original = int(parts[2]) if len(parts) == 3 else None
    except ValueError as exc:
        raise ModelError(f"bad --rope-scaling {spec!r}: {exc}") from exc
    if factor <= 1 or (original is not None and original <= 0):
        raise ModelError(f"bad --rope-scaling {spec!r}: factor must exceed 1 and original positions be positive")
    out = {"rope_type": parts[0], "factor": factor}
    if original is not None:
        out["original_max_position_embeddings"] = original
    return out


#: Named capture settings. ``default`` is the default run; ``fast`` is the short
#: setting of the fast tests and quick looks (2048-token windows of the pydoc
#: topics, short topics concatenated, 8 windows x 4 samples = 32 queries per bucket).
PRESETS = {
    "default": CaptureOptions(),
    "fast": CaptureOptions(corpus="pydoc-topics", docs=8, seq_len=2048, short_docs="concat", bucket_size=128,
                           samples_per_bucket=4.0),
}
