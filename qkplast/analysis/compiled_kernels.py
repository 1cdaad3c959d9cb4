"""The numba kernels behind :mod:`qkplast.analysis.compiled`, in a module of their own so that numba is imported
(about 0.3 s) only when an analysis first calls one of them, not by every ``import qkplast``."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, inline="always")
def _top(scores, idx, used, out):  # pragma: no cover (compiled, inlined)
    """``out[c] = max over the used slots of scores[idx[slot], c]`` (``-inf`` where none is used)."""
    out[:] = -np.inf
    for slot in range(idx.shape[0]):
        if used[slot]:
            row = scores[idx[slot]]
            for c in range(out.shape[0]):
                out[c] = max(out[c], row[c])


@numba.njit(nogil=True, cache=True)
def set_winner_counts_kernel(scores, idx, used, twice, group, counts, unsure, threshold):  # pragma: no cover
    """Per set: tops, close threshold, win counts of the certain winners and the uncertain cells
    (:func:`qkplast.analysis.compiled.set_winner_counts`)."""
    n_set, n_slot = idx.shape
    n_col = scores.shape[1]
    n_close = np.zeros(n_col, dtype=np.int32)
    winner = np.zeros(n_col, dtype=np.int32)
    down = np.float32(-np.inf)
    for s in range(n_set):
        thr = threshold[s]
        _top(scores, idx[s], used[s], thr)
        for c in range(n_col):  # float32 arithmetic, as close_threshold's
            thr[c] = np.nextafter(np.float32(thr[c] - twice[c]), down)
        n_close[:] = 0
        for slot in range(n_slot):  # the set's rows again, while they are in cache
            if used[s, slot]:
                row = scores[idx[s, slot]]
                for c in range(n_col):  # branch-free, so the loop runs in vector registers
                    hit = row[c] >= thr[c]
                    n_close[c] += hit
                    winner[c] = np.int32(slot) if hit else winner[c]
            else:  # an unused slot scores -inf, close only under an infinite bound (as in the torch path)
                for c in range(n_col):
                    hit = thr[c] == -np.inf
                    n_close[c] += hit
                    winner[c] = np.int32(slot) if hit else winner[c]
        for c in range(n_col):
            if n_close[c] == 1:
                counts[s, winner[c], group[c]] += 1.0
            else:
                unsure[s, c] = True


#: the pair terms' sums may be reordered (vector registers) and multiply-adds fused: rounding only
_SUMS = {"reassoc", "contract"}


@numba.njit(nogil=True, inline="always", fastmath=_SUMS)
def _terms(x, means, weights, mu, var):  # pragma: no cover (compiled, inlined)
    """``mu[m] = x . means[m]`` and ``var[m] = sum_d weights[m, d] x_d^2``."""
    for m in range(means.shape[0]):
        acc = 0.0
        for d in range(x.shape[0]):
            acc += x[d] * means[m, d]
        mu[m] = acc
    for m in range(weights.shape[0]):
        acc = 0.0
        for d in range(x.shape[0]):
            acc += x[d] * x[d] * weights[m, d]
        var[m] = acc


@numba.njit(nogil=True, cache=True, fastmath=_SUMS)
def pair_terms_kernel(keys, pi, pj, means, weights, dt, drift, drift_means, drift_weights,
                      mu, var, drift_mu, drift_var, rows32, square_sums):  # pragma: no cover (compiled)
    """Per pair: projections and weighted square sums of ``delta = k_i - k_j`` and of ``delta - dt g``
    (:func:`qkplast.analysis.compiled.pair_terms`); the float32 copy of ``delta`` and its float64 sum of squares."""
    n_head, n_bucket, n_pair = mu.shape[0], pi.shape[0], pi.shape[1]
    dim = keys.shape[2]
    delta = np.empty(dim, dtype=np.float64)
    moved = np.empty(dim, dtype=np.float64)
    with_drift = drift_means.shape[2] + drift_weights.shape[2] > 0
    for h in range(n_head):
        for b in range(n_bucket):
            for p in range(n_pair):
                ki, kj, out32 = keys[h, pi[b, p]], keys[h, pj[b, p]], rows32[h, b, p]
                acc = 0.0
                for d in range(dim):
                    delta[d] = ki[d] - kj[d]
                    out32[d] = np.float32(delta[d])
                    acc += delta[d] * delta[d]
                square_sums[h, b, p] = acc
                _terms(delta, means[h, b], weights[h, b], mu[h, b, p], var[h, b, p])
                if with_drift:
                    for d in range(dim):
                        moved[d] = delta[d] - dt[b, p] * drift[h, d]
                    _terms(moved, drift_means[h, b], drift_weights[h, b], drift_mu[h, b, p], drift_var[h, b, p])


@numba.njit(nogil=True, cache=True)
def gini_kernel(counts, n_rows, num, den, m, out):  # pragma: no cover (compiled)
    """``out[source, set, head]`` from ``counts[set, slot, head, source]``
    (:func:`qkplast.analysis.compiled.win_count_gini`)."""
    n_set, n_slot, n_head, n_source = counts.shape
    for s in range(n_set):
        scale = 1 - 1 / max(m[s], 2.0)
        for h in range(n_head):
            for src in range(n_source):
                acc = 0.0
                for slot in range(n_slot):  # in slot order, as torch's sum over the slot axis
                    p = counts[s, slot, h, src] / n_rows[src]
                    acc += p * p
                value = (1 - acc) * num[src] / den[src] / scale
                out[src, s, h] = np.nan if m[s] < 2 or n_rows[src] < 2 else value


#: a minimum and a sum of small whole numbers are exact in any order; the scores are finite (the caller checks
#: that no product can overflow), so NaN and signed zeros need no care: the reductions run in vector registers
_EXACT_REDUCTIONS = {"reassoc", "nnan", "nsz"}


@numba.njit(nogil=True, cache=True, fastmath=_EXACT_REDUCTIONS)
def real_slot_signs_kernel(score, real, nearest, sums):  # pragma: no cover (compiled)
    """``nearest[h, b, p]`` = min ``|score|`` and ``sums[h, b, p]`` = sum of signs over the slots with ``real[b]``
    (:func:`qkplast.analysis.compiled.real_slot_signs`)."""
    n_head, n_bucket, n_pair, n_slot = score.shape
    slots = np.empty(n_slot, dtype=np.int64)
    for b in range(n_bucket):
        n_real = 0
        for slot in range(n_slot):  # the real slots of the bucket (a prefix when they come first)
            if real[b, slot]:
                slots[n_real] = slot
                n_real += 1
        prefix = n_real == 0 or slots[n_real - 1] == n_real - 1
        for h in range(n_head):
            for p in range(n_pair):
                row = score[h, b, p]
                low = np.float32(np.inf)
                total = np.int32(0)
                if prefix:  # contiguous: the loop runs in vector registers
                    for slot in range(n_real):
                        value = row[slot]
                        low = min(low, abs(value))
                        total += np.int32(value > 0) - np.int32(value < 0)
                else:
                    for i in range(n_real):
                        value = row[slots[i]]
                        low = min(low, abs(value))
                        total += np.int32(value > 0) - np.int32(value < 0)
                nearest[h, b, p] = low
                sums[h, b, p] = total
