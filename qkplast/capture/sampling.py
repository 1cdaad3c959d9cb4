"""Which heads and which token positions a capture keeps (thesis section 4.1).

* Heads (section 4.1.3): ``heads`` query heads uniformly at random over all
  (eligible layer, query head) pairs with ``numpy.random.default_rng(seed)``,
  all of them if fewer; key head ``q_head // (n_q / n_kv)`` (eq. 4.1).
* Positions (section 4.1.2): each token of ``[0, seq_len)`` is kept with
  probability ``samples_per_bucket / bucket_size``, independently, from a
  generator seeded by ``(seed, SHA-256 of the document id)``, so a document's
  positions do not depend on corpus order or on other documents; optionally at
  least ``min_per_bucket`` positions per bucket. Q and K use the same positions.

Both are pure functions of their arguments: the planner
(:mod:`qkplast.capture.plan`) calls :func:`sample_heads` on a layout read from the
config alone, before any weight is loaded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from qkplast.capture_format import CaptureError

if TYPE_CHECKING:
    from qkplast.capture.architecture import ArchitectureSpec

__all__ = ["HeadPlan", "sample_heads", "sample_positions"]


@dataclass(frozen=True)
class HeadPlan:
    """The sampled query heads, sorted by (layer, q_head), and their key heads (eq. 4.1)."""

    layer: np.ndarray
    q_head: np.ndarray
    kv_head: np.ndarray
    rope: np.ndarray
    n_eligible: int
    requested: int | None
    seed: int

    def __len__(self) -> int:
        return len(self.layer)


def sample_heads(layout: ArchitectureSpec, heads: int | None = 300, seed: int = 0) -> HeadPlan:
    """Sample ``heads`` query heads uniformly over (eligible layer, q_head) pairs (thesis 4.1.3).

    ``numpy.random.default_rng(seed).choice`` draws without replacement from the
    pairs listed in (layer, q_head) order; with ``heads=None`` or ``heads`` at
    least the number of eligible heads, all are taken.
    """
    if heads is not None and heads <= 0:
        raise CaptureError(f"heads must be positive, got {heads}")
    rope_of = {info.layer: info.rope for info in layout.layers}
    pairs = np.array([(layer, h) for layer in layout.eligible_layers for h in range(layout.n_q_heads)], dtype=np.int64)
    pairs = pairs[chosen_heads(len(pairs), heads, seed)]
    group = layout.n_q_heads // layout.n_kv_heads
    return HeadPlan(
        layer=pairs[:, 0],
        q_head=pairs[:, 1],
        kv_head=pairs[:, 1] // group,
        rope=np.array([rope_of[int(layer)] for layer in pairs[:, 0]], dtype=bool),
        n_eligible=len(layout.eligible_layers) * layout.n_q_heads,
        requested=heads,
        seed=seed,
    )


def chosen_heads(n_eligible: int, heads: int | None, seed: int) -> np.ndarray:
    """Indices of the sampled heads among ``n_eligible`` listed in (layer, q_head) order, sorted.

    The one place the head draw happens, so a capture of all heads can be cut
    down to exactly the heads a smaller capture with the same seed would take.
    """
    if heads is None or heads >= n_eligible:
        return np.arange(n_eligible)
    return np.sort(np.random.default_rng(seed).choice(n_eligible, size=heads, replace=False))


def _doc_seed(seed: int, doc_id: str) -> np.random.SeedSequence:
    words = np.frombuffer(hashlib.sha256(doc_id.encode("utf-8")).digest(), dtype=np.uint32)
    return np.random.SeedSequence([seed, *words.tolist()])


def sample_positions(
    seq_len: int,
    bucket_size: int,
    *,
    doc_id: str,
    seed: int = 0,
    samples_per_bucket: float = 1,
    min_per_bucket: int = 0,
) -> np.ndarray:
    """Sample token positions of one document (thesis 4.1.2).

    Each position in ``[0, seq_len)`` is kept independently with probability
    ``samples_per_bucket / bucket_size``, so a bucket holds ``samples_per_bucket``
    samples in expectation. Buckets with fewer than ``min_per_bucket`` kept
    positions are topped up with positions drawn uniformly without replacement
    from the rest of the bucket. The generator is seeded by ``seed`` and the
    SHA-256 of ``doc_id``, so the result does not depend on document order.

    Returns
    -------
    numpy.ndarray
        Sorted ``int64`` positions.
    """
    if not 0 < samples_per_bucket <= bucket_size:
        raise CaptureError(f"samples_per_bucket must lie in (0, bucket_size={bucket_size}], got {samples_per_bucket}")
    if min_per_bucket < 0:
        raise CaptureError(f"min_per_bucket must be non-negative, got {min_per_bucket}")
    rng = np.random.default_rng(_doc_seed(seed, doc_id))
    keep = rng.random(seq_len) < samples_per_bucket / bucket_size  # [seq_len]
    if min_per_bucket:
        for start in range(0, seq_len, bucket_size):
            bucket = keep[start : start + bucket_size]  # a view: topping up writes into keep
            short = min(min_per_bucket, bucket.size) - int(bucket.sum())
            if short > 0:
                bucket[rng.choice(np.flatnonzero(~bucket), size=short, replace=False)] = True
    return np.flatnonzero(keep).astype(np.int64)
