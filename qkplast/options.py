"""Analysis options: every choice the thesis leaves open, with its documented default.

The defaults follow the thesis text (sections 4.2-4.4); each alternative is the
reading a careful reader could also defend, so runs can show how much a result
depends on it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Literal

_CHOICES = {
    "query_position": ("midpoint", "mean"),
    "semantic_stats": ("per_bucket", "global"),
    "positional_fit": ("global", "per_bucket"),
    "covariance": ("diagonal", "full", "joint"),
    "eligible_keys": ("earlier_buckets", "before_query"),
    "pair_docs": ("same", "any"),
    "bucket_weight": ("tokens", "samples", "uniform"),
    "edge_rule": ("position", "bucket_index"),
}


EXECUTION_OPTIONS = ("device", "head_chunk")


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
        faster than 32-head chunks here), and near 1 GB on a GPU.
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

    def __post_init__(self):
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"option {name}={getattr(self, name)!r} is not one of {allowed}")
        if not 0 <= self.taxonomy_low <= self.taxonomy_high <= 1:
            raise ValueError("taxonomy thresholds need 0 <= taxonomy_low <= taxonomy_high <= 1")
        if not 0 < self.edge_fraction <= 0.5:
            raise ValueError(f"edge_fraction must lie in (0, 0.5], got {self.edge_fraction}")
        if self.head_chunk < 0:
            raise ValueError(f"option head_chunk must be >= 0 (0 = automatic), got {self.head_chunk}")
        for name in ("n_pairs", "context_bins", "map_bins"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"option {name} must be >= 1, got {getattr(self, name)}")
        if self.min_bucket_samples < 2:
            raise ValueError("min_bucket_samples must be >= 2: a variance needs two samples")
        if self.covariance == "joint" and (self.positional_fit, self.semantic_stats) != ("per_bucket", "per_bucket"):
            raise ValueError(
                'covariance="joint" models all coordinates from the bucket\'s own queries; '
                'it needs positional_fit="per_bucket" and semantic_stats="per_bucket"'
            )

    @classmethod
    def from_kwargs(cls, options: "AnalysisOptions | None" = None, **overrides) -> "AnalysisOptions":
        """Options from an optional base plus keyword overrides; unknown names are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown analysis option(s) {unknown}; valid options: {sorted(names)}")
        return replace(options or cls(), **overrides)

    def to_dict(self) -> dict:
        return asdict(self)

    def result_key(self) -> dict:
        """The options that can change results: all but the execution ones (``device``, ``head_chunk``)."""
        return {k: v for k, v in asdict(self).items() if k not in EXECUTION_OPTIONS}
