"""Listwise plasticity from float32 scores: winners certified by a rounding bound equal the float64 winners, near
ties included; the nearest-bucket mass has one value per document for its interval."""

import warnings

import numpy as np
import pytest
import torch

from qkplast.analysis.listwise import (certified_winner_plasticity, close_threshold, float32_scores, gather_sets,
                                       listwise, softmax_mass, winner_plasticity)
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.results.extra_metrics import nearest_mass_intervals
from qkplast.theory.planted import planted_capture


def test_certified_winners_equal_float64_winners_with_near_ties(rng):
    h, n, n_key, d = 3, 40, 30, 16
    q = torch.as_tensor(rng.normal(size=(h, n, d)))
    k = torch.as_tensor(rng.normal(size=(h, n_key, d)))
    k[:, 7] = k[:, 3] * (1 + 1e-9)  # near ties in every query's scores: float32 cannot order them
    k[:, 12] = k[:, 5]  # exact ties: the win is split
    idx = torch.as_tensor(np.stack([rng.permutation(n_key)[:8] for _ in range(10)] + [[3, 7, 5, 12, 0, 1, 2, 4]]))
    smask = torch.ones_like(idx, dtype=torch.bool)
    s64 = torch.einsum("hnd,hkd->hnk", q, k)  # [head, query, key]
    want = winner_plasticity(gather_sets(s64, idx, smask), smask)
    s32, bound = float32_scores(q, k)
    exact = lambda hh, qq, kk: (q[hh, qq][:, None] * k[hh[:, None], kk]).sum(-1)  # noqa: E731
    got = certified_winner_plasticity(s32, bound, idx, smask, exact, h, True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # an infinite bound sends every row to float64: the same values
    inf = certified_winner_plasticity(s32, torch.full_like(bound, float("inf")), idx, smask, exact, h, True)
    torch.testing.assert_close(inf, want, rtol=1e-12, atol=1e-12)



def test_two_sources_in_one_pass_equal_each_source_alone(rng):
    """Captured queries and model draws share one product and one pass over the sets (listwise_kernel): each
    source keeps its own winner distribution and its own unbiased flag; padded slots stay out."""
    h, n_key, d = 2, 25, 8
    rows = (12, 5)
    q = torch.as_tensor(rng.normal(size=(h, sum(rows), d)))
    k = torch.as_tensor(rng.normal(size=(h, n_key, d)))
    k[:, 9] = k[:, 2] * (1 + 1e-9)  # near ties: some rows go to float64
    idx = torch.as_tensor(np.stack([rng.permutation(n_key)[:6] for _ in range(7)] + [[2, 9, 0, 1, 3, 4]]))
    smask = torch.ones_like(idx, dtype=torch.bool)
    smask[0, 4:] = False  # a set of four keys in six slots
    s32, bound = float32_scores(q, k)
    exact = lambda hh, rr, kk: (q[hh, rr][:, None] * k[hh[:, None], kk]).sum(-1)  # noqa: E731
    both = certified_winner_plasticity(s32, bound, idx, smask, exact, h, (False, True), rows=rows)
    assert both.shape == (2, h, idx.shape[0])
    s64 = torch.einsum("hnd,hkd->hnk", q, k)  # [head, row, key]
    for src, (lo, hi, unbiased) in enumerate(((0, rows[0], False), (rows[0], sum(rows), True))):
        want = winner_plasticity(gather_sets(s64[:, lo:hi], idx, smask), smask, unbiased)
        torch.testing.assert_close(both[src], want, rtol=1e-12, atol=1e-12)


def test_the_float32_threshold_is_never_above_the_float64_one_and_below_it_by_roundings_only(rng):
    top = torch.as_tensor(rng.normal(size=(50, 40)) * 10 ** rng.uniform(-3, 3, (50, 40)), dtype=torch.float32)
    bound = torch.as_tensor(rng.uniform(0, 1e-4, 40)) * top.abs().amax(0).to(torch.float64)  # [column]
    bound[3] = 0.0  # an exact product: the threshold is the top score itself, one step down
    exact = top.to(torch.float64) - 2 * bound  # [set, column]
    thr = close_threshold(top, bound)
    assert thr.dtype == torch.float32 and thr.shape == top.shape
    assert bool((thr.to(torch.float64) <= exact).all())  # every score the float64 test counts as close, it counts
    # below it by float32 roundings only: of 2 bound (rounded up) and of the difference (and its step down)
    slack = 2.0**-22 * (2 * bound + exact.abs()) + 2 * torch.finfo(torch.float32).tiny
    assert bool((exact - thr.to(torch.float64) <= slack).all())
    largest = exact.to(torch.float32)  # the largest float32 not above the float64 threshold
    largest = torch.where(largest.to(torch.float64) > exact, torch.nextafter(largest, torch.tensor(-torch.inf)), largest)
    assert bool((thr < largest).any())  # the step down happened, not only exact casts
    assert bool((close_threshold(top, torch.full_like(bound, torch.inf)) == -torch.inf).all())  # infinite bound


def test_padded_sets_and_the_nearest_mass_per_document():
    cap, _ = planted_capture(n_heads=2, dim=8, n_docs=5, samples_per_bucket=6, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        lw = listwise(cap, set_sizes=(2, 0))
    doc = lw.nearest_mass_doc  # [head, bucket, document]
    assert doc.sizes["document"] == 5
    # the pooled mass is the query-weighted mean of the documents' (equal queries per document here: their mean)
    counts = np.stack([[(cap.doc.values[cap.bucket.values == b] == d).sum() for d in lw.document.values]
                       for b in lw.query_bucket.values])  # [bucket, document]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        pooled = np.nansum(doc.values * counts, -1) / np.sum(np.where(np.isnan(doc.values), 0, counts), -1)
    ok = ~np.isnan(lw.nearest_mass.values)
    np.testing.assert_allclose(pooled[ok], lw.nearest_mass.values[ok], rtol=1e-10)
    table = nearest_mass_intervals(lw)
    assert "5 documents" in table.attrs["method"]
    row = table.loc[5]
    assert 0 < row["full scores lo"] <= row["full scores"] <= row["full scores hi"] < 1
    assert row["full scores"] == pytest.approx(float(np.nanmean(doc.sel(query_bucket=5).mean("head"))))


def test_the_nearest_mass_equals_a_masked_softmax_per_query(rng):
    """softmax_mass, keys first and one product for every group, against each query's own masked softmax: keys of no
    query's group, a group with no keys (NaN), a key of another group far above a query's own (its weight must not
    overflow), and the one-group case."""
    n_key, h, n_q = 12, 3, 7
    scores = torch.as_tensor(rng.normal(size=(n_key, h, n_q)) * 5, dtype=torch.float32)  # [key, head, query]
    key_group = torch.zeros(3, n_key, dtype=torch.bool)
    key_group[0, :5], key_group[1, 5:10] = True, True  # keys 10 and 11 in no group; group 2 has no keys
    query_group = torch.as_tensor([0, 0, 1, 1, 1, 2, 0])
    scores[6, :, 0] = 500.0  # a key of group 1 far above query 0's own keys (group 0): exp would overflow
    nearest = torch.zeros(n_key, dtype=torch.bool)
    nearest[[1, 3, 6, 11]] = True
    scale = 0.3
    got = softmax_mass(scores, scale, key_group, query_group, nearest)  # [head, query]
    same = key_group[query_group]  # [query, key]
    s = scores.permute(1, 2, 0).to(torch.float64) * scale  # [head, query, key]
    w = torch.softmax(s.masked_fill(~same[None], -torch.inf), -1)
    want = (w * nearest.to(torch.float64)).sum(-1)
    assert bool(torch.isnan(got[:, 5]).all()) and bool(torch.isnan(want[:, 5]).all())
    keep = torch.arange(n_q) != 5
    torch.testing.assert_close(got[:, keep], want[:, keep], rtol=1e-5, atol=1e-7)
    assert bool(torch.isfinite(got[:, 0]).all())
    one = softmax_mass(scores, scale, torch.ones(1, n_key, dtype=torch.bool), torch.zeros(n_q, dtype=torch.long), nearest)
    want_one = (torch.softmax(s, -1) * nearest.to(torch.float64)).sum(-1)
    torch.testing.assert_close(one, want_one, rtol=1e-5, atol=1e-7)
