"""Permutation nulls (issue 9, item 11): observed summaries are the pair_statistics ratios; a planted
structure beats its null, its absence does not."""

import warnings

import numpy as np
import pytest

from qkplast.stats import nulls
from qkplast.analysis.plasticity import PlasticityWarning, pair_statistics
from qkplast.theory.planted import planted_capture


@pytest.fixture(scope="module")
def correlated():
    return planted_capture(n_heads=3, dim=12, n_docs=24, samples_per_bucket=4, seed=5)[0]


@pytest.fixture(scope="module")
def diagonal():
    return planted_capture(n_heads=3, dim=12, n_docs=24, samples_per_bucket=4, diagonal_semantic=True, seed=5)[0]


def quantiles(x):
    x = x.values.ravel()
    x = x[~np.isnan(x)]
    return np.quantile(x, [0.5, 0.05, 0.95])


def test_observed_summaries_are_the_pair_statistics_ratios(correlated):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        ps = pair_statistics(correlated)
    a = nulls.diagonal_null(correlated, n_perm=20)
    np.testing.assert_allclose(a.observed_all_pairs.values[:3], quantiles(ps.v_diag / ps.v_full), rtol=1e-10)
    c = nulls.independence_null(correlated, n_perm=20)
    np.testing.assert_allclose(c.observed_all_pairs.values[:3], quantiles(ps.v_joint / ps.v_indep), rtol=1e-10)
    assert a.attrs["n_perm"] == 20 and a.null.shape == (20, 4)
    assert 1 / 21 <= float(a.p_value) <= 1


def test_correlated_semantics_beat_the_diagonal_null_and_isotropic_ones_do_not(correlated, diagonal):
    strong = nulls.diagonal_null(correlated, n_perm=100, pairs_per_bucket=16)
    assert float(strong.p_value) < 0.02
    assert strong.observed.sel(summary="spread") > strong.null_q95.sel(summary="spread")
    none = nulls.diagonal_null(diagonal, n_perm=100, pairs_per_bucket=16)
    assert float(none.p_value) > 0.05


def test_bucket_shuffle_null_and_table(correlated):
    b = nulls.bucket_shuffle_null(correlated, n_perm=50)
    assert (b.null.sel(summary="median") >= 1).all() and float(b.observed.sel(summary="median")) >= 1
    c = nulls.independence_null(correlated, n_perm=50)
    # planted queries have an independent positional residual: the ratio's spread is the null's
    assert float(c.p_value) > 0.05
    table = nulls.null_table({"max/min": b, "joint/indep": c})
    assert list(table.index) == ["max/min", "joint/indep"] and (table["permutations"] == 50).all()
    v, text, one = nulls.describe(c, "joint/indep", "coordinate 1 permuted")
    assert v["word"] != "confirmed" and "joint/indep: observed median" in text and "coordinate 1 permuted" in text
    assert list(one.index) == ["joint/indep"]
