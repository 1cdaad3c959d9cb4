"""The compiled CPU passes (qkplast.analysis.compiled) against the torch operations they replace: the certain wins,
the Gini index and the uncertain cells bit for bit, the pair terms to rounding with their float32 rows exact, and
the Monte Carlo sign sums from them equal to the float64 product's, padding pairs and near-zero scores included."""

import numpy as np
import torch

from qkplast.analysis.certified_signs import PairRows, bucket_rows, float64_sign_sums, sign_sums
from qkplast.analysis.compiled import pair_terms, real_slot_signs, set_winner_counts, win_count_gini
from qkplast.analysis.listwise import (certain_wins, certain_wins_torch, close_threshold, column_groups,
                                       gini_plasticity_torch, set_scores, twice_bound32)
from qkplast.analysis.plasticity import bucket_members


def planted_scores(rng, n_key=40, n_head=3, n_row=7):
    """float32 scores ``[key, head * row]`` with exact ties (two equal keys) and near ties (within float32 rounding)."""
    s = torch.as_tensor(rng.normal(size=(n_key, n_head * n_row)), dtype=torch.float32)
    s[5] = s[2]  # exact ties in every column
    s[9] = torch.nextafter(s[4], torch.tensor(np.inf, dtype=torch.float32))  # one float32 step apart
    return s


def planted_sets(rng, n_key=40):
    """Sets of 6 slots, some unused, one set holding the tied keys and one with repeated keys."""
    idx = torch.as_tensor(np.stack([rng.permutation(n_key)[:6] for _ in range(9)] + [[2, 5, 4, 9, 0, 1],
                                                                                      [3, 3, 8, 8, 1, 1]]))
    smask = torch.ones_like(idx, dtype=torch.bool)
    smask[0, 4:] = False  # a set of four keys
    smask[3, 1:] = False  # a set of one key: never certain of anything but its only key
    return idx, smask


def test_certain_wins_compiled_equal_torch_bit_for_bit(rng):
    s = planted_scores(rng)
    idx, smask = planted_sets(rng)
    n_head, sizes = 3, (4, 3)  # two sources of 4 and 3 rows per head
    group = column_groups(n_head, sizes, s.device)
    bound = torch.as_tensor(rng.uniform(1e-7, 1e-3, size=s.shape[1]))
    bound[4] = np.inf  # an overflow guard's column: every cell uncertain
    got, want = (f(s, bound, idx, smask, group, n_head * len(sizes)) for f in (certain_wins, certain_wins_torch))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    counts, unsure, _ = got
    assert unsure[:, 4].all()  # the infinite bound
    tied_top = s[2] == s[[2, 5, 4, 9, 0, 1]].amax(0)  # [column]: the tied keys 2 and 5 top their set
    assert tied_top.any() and unsure[-2][tied_top].all()
    assert not unsure.all() and counts.sum() > 0  # and certain winners elsewhere


def test_winner_counts_use_the_bound_given(rng):
    """A zero bound leaves one close key, the top: its slot wins every cell. An infinite one makes every used key
    close: no cell is certain. The threshold is close_threshold's of the set's top."""
    s = torch.as_tensor(rng.normal(size=(10, 6)), dtype=torch.float32)
    idx = torch.arange(10)[None]
    smask = torch.ones_like(idx, dtype=torch.bool)
    counts, unsure, threshold = set_winner_counts(s, idx, smask, torch.zeros(6, dtype=torch.float32), torch.arange(6), 6)
    assert not unsure.any()
    assert torch.equal(counts[0].argmax(0), s.argmax(0)) and torch.equal(counts.sum((0, 1)), torch.ones(6, dtype=torch.float64))
    _, unsure, _ = set_winner_counts(s, idx, smask, torch.full((6,), np.inf, dtype=torch.float32), torch.arange(6), 6)
    assert unsure.all()
    bound = torch.as_tensor(rng.uniform(1e-3, 1e-1, size=6))
    _, _, threshold = set_winner_counts(s, idx, smask, twice_bound32(bound), torch.arange(6), 6)
    top = set_scores(s, idx, smask).view(*idx.shape, -1).amax(1)  # [set, column]
    assert torch.equal(threshold, close_threshold(top, bound))


def test_win_count_gini_equals_torch(rng):
    counts = torch.as_tensor(rng.integers(0, 5, size=(6, 5, 4, 2)), dtype=torch.float64)
    counts[..., 0] += 0.5  # split ties
    n_rows = torch.tensor([20.0, 1.0], dtype=torch.float64)  # a source of one row: NaN
    num, den = torch.tensor([20.0, 1.0], dtype=torch.float64), torch.tensor([19.0, 1.0], dtype=torch.float64)
    m = torch.tensor([5, 5, 1, 3, 5, 2], dtype=torch.float64)  # a set of one key: NaN
    got = win_count_gini(counts, n_rows, num, den, m).transpose(1, 2)
    want = gini_plasticity_torch(counts, n_rows, num, den, m)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0, equal_nan=True)
    assert torch.isnan(got[1]).all() and torch.isnan(got[0, :, 2]).all() and not torch.isnan(got[0, :, 0]).any()
    p = counts[0, :, 0, 0] / 20  # by hand, one cell: (1 - sum P^2) n / (n - 1) / (1 - 1/m)
    assert abs(float(got[0, 0, 0]) - float((1 - (p * p).sum()) * 20 / 19 / (1 - 1 / 5))) < 1e-15


def test_pair_terms_equal_the_differences_products(rng):
    h, s, d, b, p = 3, 30, 16, 4, 12
    keys = torch.as_tensor(rng.normal(size=(h, s, d)))
    pi, pj = torch.as_tensor(rng.integers(0, s, size=(b, p))), torch.as_tensor(rng.integers(0, s, size=(b, p)))
    pi[0, 0] = pj[0, 0]  # a padding pair: delta exactly 0
    means, weights = torch.as_tensor(rng.normal(size=(h, b, 2, d))), torch.as_tensor(rng.uniform(size=(h, b, 3, d)))
    dt, drift = torch.as_tensor(rng.normal(size=(b, p))), torch.as_tensor(rng.normal(size=(h, d)))
    drift_means, drift_weights = means[:, :, :1], weights[:, :, 1:]
    mu, var, dmu, dvar, rows32, sq = pair_terms(keys, pi, pj, means, weights, dt, drift, drift_means, drift_weights)
    delta = keys[:, pi] - keys[:, pj]  # [head, bucket, pair, dim]
    moved = delta - dt[None, :, :, None] * drift[:, None, None, :]
    torch.testing.assert_close(mu, torch.einsum("hbpd,hbmd->hbpm", delta, means), rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(var, torch.einsum("hbpd,hbmd->hbpm", delta * delta, weights), rtol=1e-13, atol=0)
    torch.testing.assert_close(dmu, torch.einsum("hbpd,hbmd->hbpm", moved, drift_means), rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(dvar, torch.einsum("hbpd,hbmd->hbpm", moved * moved, drift_weights), rtol=1e-13, atol=0)
    torch.testing.assert_close(sq, (delta * delta).sum(-1), rtol=1e-14, atol=0)
    assert torch.equal(rows32, delta.to(torch.float32))  # the Monte Carlo rows: exact roundings
    assert float(var[:, 0, 0].abs().max()) == 0.0
    none = pair_terms(keys, pi, pj, means, weights)
    assert none[2] is None and none[3] is None and torch.equal(none[0], mu)


def test_sign_sums_from_pair_rows_equal_the_float64_product(rng):
    """The compiled path's rows (float32 copy, float64 norms, float64 rows on demand) give the float64 product's
    sign sums, with a score float32 cannot sign and a padding pair."""
    h, s, d, b, p = 2, 48, 16, 3, 20
    keys = torch.as_tensor(rng.normal(size=(h, s, d)))
    queries = torch.as_tensor(rng.normal(size=(h, s, d)))
    pi, pj = torch.as_tensor(rng.integers(0, s, size=(b, p))), torch.as_tensor(rng.integers(0, s, size=(b, p)))
    pj[1, 3] = pi[1, 3]  # a padding pair
    onehot = torch.zeros(b, s, dtype=torch.float64)
    onehot[torch.as_tensor(rng.integers(0, b, size=s)), torch.arange(s)] = 1
    qidx, qmask = bucket_members(onehot)
    qmask = qmask.bool()
    # a query nearly orthogonal to a pair's difference: its score is 1e-9 of its size, far inside float32's
    # rounding bound (float32 cannot sign it) and far outside float64's (the float64 product signs it)
    q0 = qidx[0, 0]
    delta0 = keys[0, pi[0, 2]] - keys[0, pj[0, 2]]
    queries[0, q0] -= (1 - 1e-9) * (queries[0, q0] @ delta0) / (delta0 @ delta0) * delta0
    means = torch.zeros(h, b, 1, d, dtype=torch.float64)
    *_, rows32, sq = pair_terms(keys, pi, pj, means, means)
    delta = keys[:, pi] - keys[:, pj]
    want = float64_sign_sums(delta, bucket_rows(queries, qidx, qmask))
    assert torch.equal(sign_sums(PairRows(keys, pi, pj, rows32.clone(), sq), queries, qidx, qmask), want)
    assert torch.equal(sign_sums(delta, queries, qidx, qmask), want)


def test_real_slot_signs_equal_torch(rng):
    """The compiled minimum and sign sum over the real slots against torch's, zeros and padding included."""
    score = torch.as_tensor(rng.normal(size=(2, 3, 5, 7)), dtype=torch.float32)
    score[0, 0, 2, :3] = 0.0  # zeros: sign 0, nearest 0
    qmask = torch.ones(3, 7, dtype=torch.bool)
    qmask[2, 4:] = False  # padding slots: left out of both
    qmask[1, :] = False  # a bucket without queries: nearest inf, sum 0
    qmask[0, 1] = False  # a hole: the real slots are not a prefix
    score[:, 2, :, 4:] = -1e-30  # padding holds anything
    nearest, sums = real_slot_signs(score, qmask)
    want_sums = torch.where(qmask[None, :, None, :], torch.sign(score), 0).sum(-1).double()
    want_near = torch.where(qmask[None, :, None, :], score.abs(), torch.inf).amin(-1)
    assert torch.equal(sums, want_sums) and torch.equal(nearest, want_near)
    assert torch.isinf(nearest[:, 1]).all() and (sums[:, 1] == 0).all() and nearest[0, 0, 2] == 0
