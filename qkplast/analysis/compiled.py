"""Passes over key pairs and float32 scores compiled for the CPU (numba): one read of their operands, no tensor of
their size written.

* The listwise plasticity (:mod:`qkplast.analysis.listwise`) certifies each set's winner from float32 scores:
  the top score of the set, then the keys within ``2 bound`` of it (the close keys). In torch that is a gather
  of the sets' rows, a max over the slots, a comparison written out and a product that counts the close keys:
  four passes over a tensor of the sets' size. :func:`set_winner_counts` reads each set's rows where the
  product left them (twice, while they are in cache) and writes only the thresholds, the certain wins and the
  uncertain cells; :func:`win_count_gini` turns the counts into the Gini index without a dozen small tensors.
* The Monte Carlo signs (:func:`qkplast.analysis.certified_signs.sign_sums`): :func:`real_slot_signs` takes
  each row's smallest score and sum of signs over the real slots in one read.
* The pairwise plasticity (:func:`qkplast.analysis.plasticity.pair_kernel`) needs, per key pair, the
  difference's projections on the query models' means (eq. 4.11), its weighted square sums (eq. 4.12), the same
  for the AP_drop decomposition's keys without their drift, and its float32 copy for the Monte Carlo product.
  :func:`pair_terms` forms each difference once, in registers, and never stores it in float64.

Comparisons, maxima and counts of whole numbers are exact, so the certified wins are bit for bit those of the
torch path on any CPU; the pair terms' sums run in an order of the compiler's choosing (vector registers), equal
to a BLAS product's to rounding. tests/unit/analysis/test_compiled.py compares each with the torch operations it
replaces. The kernels release the GIL (the worker threads of :func:`qkplast.tensors.map_head_chunks` run them
side by side); they are compiled once per machine (about 2 s) and cached beside their module
(:mod:`qkplast.analysis.compiled_kernels`), or in numba's user-wide cache where that is read-only; numba itself
is imported when an analysis first needs it.
"""
from __future__ import annotations

import numpy as np
import torch

from qkplast.tensors import scratch


def kernels():
    """The compiled kernels' module (:mod:`qkplast.analysis.compiled_kernels`), imported on first use."""
    from qkplast.analysis import compiled_kernels

    return compiled_kernels


def set_winner_counts(scores32: torch.Tensor, idx: torch.Tensor, smask: torch.Tensor, twice_bound: torch.Tensor,
                      group: torch.Tensor, n_group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Win counts ``[set, slot, group]`` (float64) of the cells with one close key, the other cells ``[set, column]``
    and the close threshold ``[set, column]`` (float32), in one pass per set over its rows.

    ``scores32`` ``[key, column]`` are float32 scores, ``idx`` ``[set, slot]`` indexes their rows and ``smask``
    marks the used slots. Per set: the top score of each column; the threshold
    ``nextafter(top - twice_bound, -inf)`` in float32 (:func:`qkplast.analysis.listwise.close_threshold`, with
    ``twice_bound`` ``[column]`` its ``2 bound`` rounded up to float32); a key is close when its score is at least
    the threshold (an unused slot scores ``-inf``, as :func:`qkplast.analysis.listwise.set_scores` fills it). A
    cell ``(set, column)`` with exactly one close key has a certain winner, counted once in the group
    ``group[column]`` of its column. Every step is exact (a maximum, one float32 subtraction and step, a
    comparison, whole counts), so the tensors equal the torch path's.
    """
    n_set, n_slot = idx.shape
    counts = np.zeros((n_set, n_slot, n_group), dtype=np.float64)
    unsure = np.zeros((n_set, scores32.shape[1]), dtype=np.bool_)
    threshold = np.empty((n_set, scores32.shape[1]), dtype=np.float32)
    kernels().set_winner_counts_kernel(scores32.contiguous().numpy(), idx.contiguous().numpy(),
                                       smask.contiguous().numpy(), twice_bound.contiguous().numpy(),
                                       group.contiguous().numpy(), counts, unsure, threshold)
    return torch.from_numpy(counts), torch.from_numpy(unsure), torch.from_numpy(threshold)


def pair_terms(keys: torch.Tensor, pi: torch.Tensor, pj: torch.Tensor, means: torch.Tensor, weights: torch.Tensor,
               dt: torch.Tensor | None = None, drift: torch.Tensor | None = None,
               drift_means: torch.Tensor | None = None, drift_weights: torch.Tensor | None = None):
    """The pair-level terms of the closed form (eqs. 4.11-4.12) in one pass over the key pairs, no difference stored
    in float64.

    For each head ``h``, bucket ``b`` and pair ``p`` with ``delta = keys[h, pi[b, p]] - keys[h, pj[b, p]]``:

    * ``mu[h, b, p, m] = delta . means[h, b, m]`` and ``var[h, b, p, m] = sum_d weights[h, b, m, d] delta_d^2``
      (eq. 4.11's mean and eq. 4.12's diagonal variance, for several query models at once);
    * with ``drift`` ``[head, dim]`` and ``dt`` ``[bucket, pair]``: the same of ``delta - dt[b, p] drift[h]``
      against ``drift_means`` and ``drift_weights`` (the AP_drop decomposition's keys without their drift);
    * ``rows32 = float32(delta)`` ``[head, bucket, pair, dim]`` (the Monte Carlo product's rows, rounded as
      ``delta.to(float32)`` rounds them) and ``square_sums = ||delta||^2`` (float64).

    Parameters: ``keys`` ``[head, sample, dim]`` float64; ``pi``, ``pj`` ``[bucket, pair]``; ``means``
    ``[head, bucket, M, dim]``, ``weights`` ``[head, bucket, W, dim]`` (float64). The sums run in vector
    registers in an order of the compiler's choosing, so they agree with a BLAS product to rounding (about
    1e-16 relative), not bit for bit; the float32 rows are exact roundings of the float64 differences.

    Returns ``(mu, var, drift_mu, drift_var, rows32, square_sums)``; the drift terms are None without ``drift``.
    """
    n_head, n_bucket, n_pair, dim = keys.shape[0], pi.shape[0], pi.shape[1], keys.shape[2]
    f64 = dict(dtype=torch.float64)
    empty = torch.zeros(n_head, n_bucket, 0, dim, **f64)
    with_drift = drift is not None
    drift_means = drift_means if with_drift and drift_means is not None else empty
    drift_weights = drift_weights if with_drift and drift_weights is not None else empty
    out = (torch.empty(n_head, n_bucket, n_pair, means.shape[2], **f64),
           torch.empty(n_head, n_bucket, n_pair, weights.shape[2], **f64),
           torch.empty(n_head, n_bucket, n_pair, drift_means.shape[2], **f64),
           torch.empty(n_head, n_bucket, n_pair, drift_weights.shape[2], **f64),
           # consumed inside the caller's block: a per-thread buffer (fresh megabytes cost page faults)
           scratch("pair_rows32", (n_head, n_bucket, n_pair, dim), keys, torch.float32),
           torch.empty(n_head, n_bucket, n_pair, **f64))
    args = (keys, pi, pj, means, weights, dt if with_drift else torch.zeros(n_bucket, n_pair, **f64),
            drift if with_drift else torch.zeros(n_head, dim, **f64), drift_means, drift_weights)
    kernels().pair_terms_kernel(*(x.contiguous().numpy() for x in args), *(x.numpy() for x in out))
    mu, var, drift_mu, drift_var, rows32, square_sums = out
    return mu, var, (drift_mu if with_drift else None), (drift_var if with_drift else None), rows32, square_sums


def win_count_gini(counts: torch.Tensor, n_rows: torch.Tensor, num: torch.Tensor, den: torch.Tensor,
                    m: torch.Tensor) -> torch.Tensor:
    """The normalised Gini-Simpson index ``[source, set, head]`` of the win counts ``[set, slot, head, source]``:
    ``(1 - sum_i P_i^2) num / den / (1 - 1/m)`` with ``P_i = counts_i / n_rows[source]``, NaN where a set has
    fewer than two keys (``m`` ``[set]``) or a source fewer than two rows; the operations of
    :func:`qkplast.analysis.listwise.gini_plasticity`, in its order, without its dozen small tensors."""
    out = np.empty((counts.shape[3], counts.shape[0], counts.shape[2]), dtype=np.float64)
    kernels().gini_kernel(*(x.contiguous().numpy() for x in (counts, n_rows, num, den, m)), out)
    return torch.from_numpy(out)


def real_slot_signs(score: torch.Tensor, qmask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest ``|score|`` ``[head, bucket, pair]`` (float32; ``inf`` without a real slot) and the sum of the
    signs (float64) over the real slots ``qmask`` ``[bucket, slot]`` of float32 scores ``[head, bucket, pair,
    slot]``: one read of the scores where torch makes five passes (the Monte Carlo signs of
    :func:`qkplast.analysis.certified_signs.sign_sums`)."""
    nearest = np.empty(score.shape[:-1], dtype=np.float32)
    sums = np.empty(score.shape[:-1], dtype=np.float64)
    kernels().real_slot_signs_kernel(score.contiguous().numpy(), qmask.contiguous().numpy(), nearest, sums)
    return torch.from_numpy(nearest), torch.from_numpy(sums)
