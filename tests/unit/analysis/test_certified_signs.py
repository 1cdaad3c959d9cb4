"""qkplast.analysis.certified_signs: float32 sign sums certified by a rounding bound equal the float64 product's, on planted near-ties."""

import numpy as np
import pytest
import torch

from qkplast.analysis import certified_signs
from qkplast.analysis.certified_signs import bucket_rows, float64_sign_sums, sign_bound, sign_sums


def layout(n_bucket, n_slot, counts, n_sample):
    """Query lists ``[bucket, slot]`` of ``counts`` samples each (padded) out of ``n_sample``."""
    gen = torch.Generator().manual_seed(0)
    idx = torch.zeros(n_bucket, n_slot, dtype=torch.long)
    mask = torch.zeros(n_bucket, n_slot, dtype=torch.bool)
    for b, c in enumerate(counts):
        idx[b, :c] = torch.randperm(n_sample, generator=gen)[:c]
        mask[b, :c] = True
    return idx, mask


def reference(rows, queries, idx, mask):
    return float64_sign_sums(rows, bucket_rows(queries, idx, mask))


def near_ties(rows, queries, idx, mask, rel=1e-9, fraction=0.5, seed=1):
    """Move queries so that about ``fraction`` of their scores against some pairs sit at ``rel ||q|| ||r||`` from 0:
    far beyond float64 rounding (~1e-14) but well inside float32's (~1e-6)."""
    gen = torch.Generator().manual_seed(seed)
    queries = queries.clone()
    h_n, b_n = rows.shape[:2]
    for h in range(h_n):
        for b in range(b_n):
            real = idx[b][mask[b]]
            for s in real[torch.rand(len(real), generator=gen) < fraction]:
                r = rows[h, b, torch.randint(rows.shape[2], (1,), generator=gen)][0]  # [dim]
                q = queries[h, s]
                q = q - (q @ r) / (r @ r) * r  # orthogonal to r
                sign = 1.0 if torch.rand(1, generator=gen) < 0.5 else -1.0
                queries[h, s] = q + sign * rel * q.norm() / r.norm() * r
    return queries


@pytest.fixture
def problem():
    gen = torch.Generator().manual_seed(3)
    h, b, p, d, n_sample = 3, 4, 40, 64, 50
    idx, mask = layout(b, 12, [12, 9, 12, 5], n_sample)
    rows = torch.randn(h, b, p, d, generator=gen, dtype=torch.float64) * 3.0
    queries = torch.randn(h, n_sample, d, generator=gen, dtype=torch.float64) + 2.0
    return rows, queries, idx, mask


def test_equals_the_float64_product_on_random_scores_with_padding(problem):
    rows, queries, idx, mask = problem
    assert not bool(mask.all())
    got = sign_sums(rows, queries, idx, mask)
    assert got.dtype == torch.float64
    assert torch.equal(got, reference(rows, queries, idx, mask))


def test_near_ties_that_float32_gets_wrong_are_recomputed(problem):
    rows, queries, idx, mask = problem
    queries = near_ties(rows, queries, idx, mask)
    want = reference(rows, queries, idx, mask)
    # the plain float32 product does get signs wrong here, so the equality below is the certification's doing
    naive = float64_sign_sums(rows.float(), bucket_rows(queries.float(), idx, mask)).double()
    assert not torch.equal(naive, want)
    assert torch.equal(sign_sums(rows, queries, idx, mask), want)


def test_exact_ties_count_zero(problem):
    rows, queries, idx, mask = problem
    rows = rows.clone()
    rows[1, 2, 5] = 0.0  # a pair of identical keys: every score is exactly 0
    queries = queries.clone()
    queries[0, idx[3, 0]] = 0.0  # a zero query
    got = sign_sums(rows, queries, idx, mask)
    assert got[1, 2, 5] == 0
    assert torch.equal(got, reference(rows, queries, idx, mask))


def test_padding_pairs_keep_their_zero_signs_and_vanishing_pairs_are_still_recomputed(problem):
    """Differences of exact zeros (padding pairs) score 0 in float32 and float64: they are not recomputed, and their
    sums stay 0. A difference too small for float32 (it rounds to zeros there) is not such a pair: its float64 signs
    are recomputed, beside near-ties elsewhere."""
    rows, queries, idx, mask = problem
    queries = near_ties(rows, queries, idx, mask, fraction=0.3)
    rows = rows.clone()
    rows[:, 0, 30:] = 0.0  # padding pairs of every head in bucket 0
    rows[2, 1, 7] = 1e-300 * torch.arange(1.0, rows.shape[-1] + 1, dtype=torch.float64)  # float32: all zeros
    want = reference(rows, queries, idx, mask)
    got = sign_sums(rows, queries, idx, mask)
    assert (got[:, 0, 30:] == 0).all() and got[2, 1, 7] != 0
    assert torch.equal(got, want)


@pytest.mark.parametrize("dim", [2, 64, 128, 1024])
def test_the_bound_covers_the_worst_observed_float32_error(dim):
    gen = torch.Generator().manual_seed(dim)
    q = torch.randn(4000, dim, generator=gen, dtype=torch.float64) * torch.logspace(-3, 3, dim, dtype=torch.float64)
    r = torch.randn(4000, dim, generator=gen, dtype=torch.float64)
    exact = (q * r).sum(-1)
    approx = (q.float() * r.float()).sum(-1, dtype=torch.float32).double()
    err = ((approx - exact).abs() / (q.norm(dim=-1) * r.norm(dim=-1))).max().item()
    assert 0 < err < sign_bound(dim) < 1.1 * (dim + 3) * 2.0**-24


@pytest.fixture
def precision():
    """Set a torch float32 matmul precision (the new API) and restore every level afterwards."""
    levels = (torch.backends.mkldnn.matmul, torch.backends.mkldnn, torch.backends.cuda.matmul, torch.backends)
    before = [level.fp32_precision for level in levels]
    yield lambda level, value: setattr(level, "fp32_precision", value)
    for level, value in zip(levels, before):
        level.fp32_precision = value


def test_reduced_precision_products_take_the_float64_path(problem, precision, monkeypatch):
    rows, queries, idx, mask = problem
    queries = near_ties(rows, queries, idx, mask)
    want = reference(rows, queries, idx, mask)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert certified_signs.float32_products_are_exact_ieee(cpu) and certified_signs.float32_products_are_exact_ieee(cuda)
    precision(torch.backends.cuda.matmul, "tf32")
    assert not certified_signs.float32_products_are_exact_ieee(cuda) and certified_signs.float32_products_are_exact_ieee(cpu)
    precision(torch.backends.mkldnn, "bf16")  # the backend's setting, where its matmul defers ("none")
    assert not certified_signs.float32_products_are_exact_ieee(cpu)
    precision(torch.backends.mkldnn.matmul, "ieee")  # the matmul's own setting wins
    assert certified_signs.float32_products_are_exact_ieee(cpu)
    precision(torch.backends.mkldnn.matmul, "bf16")
    calls = []
    real = certified_signs.float64_sign_sums
    monkeypatch.setattr(certified_signs, "float64_sign_sums", lambda r, c: calls.append(r.dtype) or real(r, c))
    assert torch.equal(sign_sums(rows, queries, idx, mask), want)
    assert calls == [torch.float64]


def test_values_that_could_overflow_float32_take_the_float64_path(problem, monkeypatch):
    rows, queries, idx, mask = problem
    rows = rows * 1e36  # ||q|| ||r|| beyond 2^100; float32 squares of r overflow
    calls = []
    real = certified_signs.float64_sign_sums
    monkeypatch.setattr(certified_signs, "float64_sign_sums", lambda r, c: calls.append(r.shape) or real(r, c))
    got = sign_sums(rows, queries, idx, mask)
    assert calls and calls[0] == rows.shape  # the whole product, in float64
    assert torch.equal(got, reference(rows, queries, idx, mask))


def test_many_uncertain_pairs_take_one_float64_product(problem, monkeypatch):
    rows, queries, idx, mask = problem
    queries = near_ties(rows, queries, idx, mask, fraction=1.0)
    calls = []
    real = certified_signs.float64_sign_sums
    monkeypatch.setattr(certified_signs, "float64_sign_sums", lambda r, c: calls.append(r.shape) or real(r, c))
    assert torch.equal(sign_sums(rows, queries, idx, mask), reference(rows, queries, idx, mask))
    assert calls == [rows.shape]


def test_the_analysis_chunks_give_the_same_monte_carlo_in_any_block_size(monkeypatch):
    """pair_kernel's cache-sized blocks of heads change no value."""
    import warnings

    from qkplast.analysis import plasticity as module
    from qkplast.theory.planted import planted_capture

    cap, _ = planted_capture(n_heads=5, dim=16, n_docs=12, samples_per_bucket=3, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = module.plasticity(cap, n_pairs=32)
        assert module.pair_block_heads(32 * 16, 16, torch.device("cpu")) >= 5  # every head in one block
        monkeypatch.setattr(module, "PAIR_BLOCK_CPU_BYTES", 1)
        assert module.pair_block_heads(32 * 16, 16, torch.device("cpu")) == 1
        blocked = module.plasticity(cap, n_pairs=32)
    for name in ("ap", "ap_mc", "ap_mc_se"):
        np.testing.assert_array_equal(whole[name].values, blocked[name].values)
