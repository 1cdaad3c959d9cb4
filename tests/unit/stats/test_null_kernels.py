"""The permutation nulls' kernels (qkplast.stats.nulls) against a straightforward reference on planted captures.

Each reference draws the permutations as the nulls document (the same generator calls, chunk after chunk) and
evaluates the statistic one permutation, bucket and head at a time with the textbook formula. The kernels group
the work otherwise (blocks of heads, exact bucket sizes, one product for all relabellings), which changes only the
order of floating-point sums: every null value agrees to 1e-12 relative, the observed summaries are the same bit
for bit, and so is the p-value. The captures drop samples at random so that the buckets differ in size, one keeps a
single query in a bucket (too few: left out of every statistic), and the pairs per bucket exceed what the first
buckets hold.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkplast.stats import nulls, shuffles
from qkplast.tensors import argsort_last, as_f64, sort_last
from qkplast.theory.planted import planted_capture

RTOL = 1e-12


def ragged(capture, seed: int, keep: float = 0.8, starve: int | None = None):
    """``capture`` without a random fifth of its samples (unequal buckets); ``starve``: that bucket keeps one."""
    rng = np.random.default_rng(seed)
    mask = rng.random(capture.sizes["sample"]) < keep
    if starve is not None:
        members = np.flatnonzero(capture.bucket.values == starve)
        mask[members] = False
        mask[members[0]] = True
    return capture.isel(sample=np.flatnonzero(mask))


@pytest.fixture(scope="module")
def correlated():
    cap = planted_capture(n_heads=3, dim=10, n_docs=6, samples_per_bucket=5, seed=5)[0]
    return ragged(cap, 1, starve=9)


@pytest.fixture(scope="module")
def isotropic():
    cap = planted_capture(n_heads=2, dim=8, n_docs=6, samples_per_bucket=5, diagonal_semantic=True, seed=3)[0]
    return ragged(cap, 2)


def summary(x: torch.Tensor, spread: str) -> torch.Tensor:
    """The reference summary: torch.quantile, as the nulls took it before."""
    q = torch.quantile(x, torch.tensor([0.5, 0.05, 0.95], dtype=x.dtype), dim=-1)
    s = torch.log(q[2] / q[1]) if spread == "log_q95_over_q05" else q[0]
    return torch.stack([q[0], q[1], q[2], s], -1)


def p_value(observed, null) -> float:
    return float((1 + np.sum(null[:, 3] >= observed[3])) / (1 + len(null)))


def slot_permutations(s, pc: int, extra: tuple, gen):
    """The nulls' draws: uniform keys per (perm, bucket, slot, *extra), padding sorted last, argsort over slots."""
    keys = torch.rand((pc, *s.qmask.shape, *extra), generator=gen, dtype=torch.float64)
    keys = keys.masked_fill(~s.qmask.reshape(1, *s.qmask.shape, *([1] * len(extra))), 2.0)
    return keys.argsort(dim=2)


def cells(s):
    """Every (bucket with a valid pair, head) of a null's setup, in the kernels' order: the bucket, its query count,
    the head, its centred queries ``[query, dim]`` and its valid pairs' differences ``[pair, dim]``."""
    for bb in range(s.x.shape[1]):
        if not s.ok[bb].any():
            continue
        n = int(s.n[bb])
        for hh in range(s.x.shape[0]):
            yield bb, n, hh, s.x[hh, bb, :n], s.delta[hh, bb][s.ok[bb]]


def reference_diagonal(capture, n_perm, pairs, seed, perm_chunk):
    s = nulls._Setup(capture, None, pairs, seed)
    gen = torch.Generator().manual_seed(seed)
    dim = s.x.shape[-1]
    var, sig = s.model.cov, s.model.sigma2_pos
    out = []
    for p0 in range(0, n_perm, perm_chunk):
        pc = min(perm_chunk, n_perm - p0)
        perm = slot_permutations(s, pc, (dim,), gen)  # [perm, bucket, slot, dim]
        for k in range(pc):
            values = []
            for bb, n, hh, x, delta in cells(s):
                xp = torch.stack([x[perm[k, bb, :n, d], d] for d in range(dim)], -1)  # each coordinate permuted
                proj = xp[:, 1:] @ delta[:, 1:].T  # [query, pair] semantic score deviations
                v_full = (proj * proj).sum(0) / (n - 1) + delta[:, 0] ** 2 * sig[hh]
                v_diag = (delta * delta * var[hh, bb]).sum(-1)
                values.append(v_diag / v_full)
            out.append(summary(torch.cat(values), "log_q95_over_q05"))
    return torch.stack(out).numpy()


def reference_bucket_shuffle(capture, n_perm, pairs, seed, perm_chunk):
    s = nulls._Setup(capture, None, pairs, seed)
    gen = torch.Generator().manual_seed(seed)
    delta = s.delta[:, -1][:, s.sub_ok[-1]]  # [head, pair, dim]
    d2, sig = delta * delta, s.model.sigma2_pos
    bucket = torch.as_tensor(capture.bucket.values)
    _, doc = np.unique(capture.doc.values, return_inverse=True)
    doc = torch.as_tensor(doc, dtype=torch.float64)
    order = torch.argsort(doc, stable=True)
    sem = s.qr[..., 1:]
    usable = [bb for bb in range(len(s.lay.buckets)) if bool(s.ok_bucket[bb])]
    out = []
    for p0 in range(0, n_perm, perm_chunk):
        pc = min(perm_chunk, n_perm - p0)
        keys = doc[None] + torch.rand((pc, doc.numel()), generator=gen, dtype=torch.float64)
        labels = torch.empty((pc, doc.numel()), dtype=torch.long)
        labels[:, order] = bucket[torch.argsort(keys, dim=1)]
        for k in range(pc):
            per_head = []
            for hh in range(sem.shape[0]):
                v = torch.stack([(d2[hh, :, 1:] * sem[hh, labels[k] == bb].var(0)).sum(-1) + d2[hh, :, 0] * sig[hh]
                                 for bb in usable])  # [bucket, pair]
                per_head.append((v.amax(0) / v.amin(0)).median())
            out.append(summary(torch.stack(per_head), "median_over_heads"))
    return torch.stack(out).numpy()


def reference_independence(capture, n_perm, pairs, seed, perm_chunk):
    s = nulls._Setup(capture, None, pairs, seed, positional_fit="per_bucket")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for p0 in range(0, n_perm, perm_chunk):
        pc = min(perm_chunk, n_perm - p0)
        perm = slot_permutations(s, pc, (), gen)  # [perm, bucket, slot]
        for k in range(pc):
            values = []
            for bb, n, hh, x, delta in cells(s):
                sem = x[:, 1:] @ delta[:, 1:].T  # [query, pair] semantic score deviations
                v_indep = (sem * sem).sum(0) / (n - 1) + delta[:, 0] ** 2 * (x[:, 0] ** 2).sum() / (n - 1)
                cross = x[perm[k, bb, :n], 0] @ sem / (n - 1)  # coordinate 1 permuted against the others
                values.append((v_indep + 2 * delta[:, 0] * cross) / v_indep)
            out.append(summary(torch.cat(values), "log_q95_over_q05"))
    return torch.stack(out).numpy()


CASES = [  # (null, reference, pairs per bucket, permutations per chunk)
    (nulls.diagonal_null, reference_diagonal, 6, 8),
    (nulls.diagonal_null, reference_diagonal, 40, 7),  # more pairs than the first buckets hold; uneven last chunk
    (nulls.bucket_shuffle_null, reference_bucket_shuffle, 8, 9),
    (nulls.independence_null, reference_independence, 10, 11),
]


@pytest.mark.parametrize(("null", "reference", "pairs", "chunk"), CASES,
                         ids=[f"{c[0].__name__}-{c[2]}-{c[3]}" for c in CASES])
@pytest.mark.parametrize("world", ["correlated", "isotropic"])
def test_kernels_give_the_reference_null(null, reference, pairs, chunk, world, request):
    capture = request.getfixturevalue(world)
    n_perm, seed = 23, 4
    got = null(capture, n_perm=n_perm, pairs_per_bucket=pairs, seed=seed, perm_chunk=chunk)
    want = reference(capture, n_perm, pairs, seed, chunk)
    np.testing.assert_allclose(got.null.values, want, rtol=RTOL, atol=0)
    # the observed summary is computed as before, so the p-value is the reference's bit for bit
    assert float(got.p_value) == p_value(got.observed.values, want)
    np.testing.assert_array_equal(got.null_median.values, np.median(got.null.values, 0))


def test_a_null_computed_twice_is_the_same(correlated):
    a = nulls.diagonal_null(correlated, n_perm=12, pairs_per_bucket=6, seed=2)
    b = nulls.diagonal_null(correlated, n_perm=12, pairs_per_bucket=6, seed=2)
    np.testing.assert_array_equal(a.null.values, b.null.values)
    c = nulls.diagonal_null(correlated, n_perm=12, pairs_per_bucket=6, seed=3)
    assert not np.array_equal(a.null.values, c.null.values)


def test_head_blocks_do_not_change_the_null(correlated, monkeypatch):
    """One head per block (the CPU's smallest) gives the numbers of one block for all heads."""
    whole = nulls.bucket_shuffle_null(correlated, n_perm=10, pairs_per_bucket=6, seed=1)
    monkeypatch.setattr(nulls, "NULL_CPU_MB", 0)
    blocks = nulls.bucket_shuffle_null(correlated, n_perm=10, pairs_per_bucket=6, seed=1)
    np.testing.assert_allclose(blocks.null.values, whole.null.values, rtol=RTOL, atol=0)
    assert float(blocks.p_value) == float(whole.p_value)


def test_observed_summaries_match_the_straightforward_formula(correlated):
    """The observed ratios of the subset pairs, from each bucket's unpermuted queries (reference: identity permutation)."""
    s = nulls._Setup(correlated, None, 6, 0)
    got = nulls.diagonal_null(correlated, n_perm=3, pairs_per_bucket=6, seed=0)
    values = []
    for bb in range(s.x.shape[1]):
        if not s.ok[bb].any():
            continue
        n = int(s.n[bb])
        for hh in range(s.x.shape[0]):
            x, delta = s.x[hh, bb, :n], s.delta[hh, bb][s.ok[bb]]
            proj = x[:, 1:] @ delta[:, 1:].T  # [query, pair]
            v_full = (proj * proj).sum(0) / (n - 1) + delta[:, 0] ** 2 * s.model.sigma2_pos[hh]
            values.append((delta * delta * s.model.cov[hh, bb]).sum(-1) / v_full)
    np.testing.assert_allclose(got.observed.values, summary(torch.cat(values), "log_q95_over_q05").numpy(),
                               rtol=RTOL)


# --------------------------------------------------------------------------- order statistics


@pytest.mark.parametrize("shape", [(7,), (1,), (2,), (5, 1), (4, 301), (3, 2, 1000)])
def test_quantiles_are_torch_quantile_bit_for_bit(shape, rng):
    x = torch.as_tensor(rng.lognormal(size=shape))
    q = [0.5, 0.05, 0.95, 0.0, 1.0, 0.37]
    want = torch.quantile(x, torch.tensor(q, dtype=x.dtype), dim=-1)
    assert torch.equal(nulls.quantiles(x, q), want)


def test_quantiles_of_a_row_with_nan_are_nan_like_torch_quantile(rng):
    x = torch.as_tensor(rng.normal(size=(3, 50)))
    x[1, 7] = float("nan")
    want = torch.quantile(x, torch.tensor([0.5, 0.05], dtype=x.dtype), dim=-1)
    got = nulls.quantiles(x, [0.5, 0.05])
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got[:, 1]).all()
    assert torch.equal(got[:, [0, 2]], want[:, [0, 2]])


def test_sort_and_argsort_on_the_cpu_are_torch_s(rng):
    x = torch.as_tensor(rng.normal(size=(6, 40)))
    x[2, 3] = float("nan")  # NaN last, as torch.sort puts it
    np.testing.assert_array_equal(sort_last(x).numpy(), torch.sort(x, -1).values.numpy())  # NaN where torch's is
    keys = torch.rand(5, 4, 43, dtype=torch.float64)
    assert torch.equal(argsort_last(keys), torch.argsort(keys, -1))


# --------------------------------------------------------------------------- position shuffles


def test_slope_nulls_are_the_two_nulls_alone(correlated):
    both = shuffles.slope_nulls(correlated, n_perm=30, seed=3, chunk=7)
    sign = shuffles.key_slope_sign_null(correlated, n_perm=30, seed=3, chunk=7)
    off = nulls.off_axis_null(correlated, n_perm=30, seed=3, chunk=7)
    for name, alone in (("key_slope_sign", sign), ("off_axis", off)):
        assert both[name]["observed"] == alone["observed"]
        np.testing.assert_array_equal(both[name]["null"], alone["null"])


def test_position_sums_are_the_einsum_bit_for_bit(correlated):
    """The position sums come from one product per chunk over clouds laid out once; the values (hence every sign
    the sign-agreement null compares) are torch.einsum's, as before."""
    cpu = torch.device("cpu")
    q, k, t = (as_f64(correlated[name], cpu) for name in ("q", "k", "position"))  # as the null reads them
    qc, kc, tc = q - q.mean(1, keepdim=True), k - k.mean(1, keepdim=True), t - t.mean()
    seen = []

    def record(b_q, b_k, mu_q, stt):
        seen.append((b_q.clone(), b_k.clone()))
        return b_q[..., 0].mean(0)

    shuffles.position_shuffle_null(correlated, record, n_perm=9, seed=1, chunk=4)
    gen = torch.Generator(device="cpu").manual_seed(1)
    tps = [tc[None]] + [tc[torch.argsort(torch.rand(m, t.numel(), generator=gen), dim=-1)] for m in (4, 4, 1)]
    assert len(seen) == len(tps)
    for (b_q, b_k), tp in zip(seen, tps):
        assert torch.equal(b_q, torch.einsum("hsd,ps->hpd", qc, tp))
        assert torch.equal(b_k, torch.einsum("hsd,ps->hpd", kc, tp))
