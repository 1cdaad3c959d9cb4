"""The products a chapter computes from a run's capture, kept in the run directory (qkplast.rundir.derived): the
first call computes and saves, the next reads the same values back without computing, and the key follows every
setting and the code (a change of the sources it names computes the product again)."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pandas as pd
import pytest

import qkplast.provenance
from qkplast.analysis.pairs import PlasticityWarning
from qkplast.analysis.plasticity import pair_statistics, plasticity
from qkplast.analysis.pooling import pooling_table
from qkplast.options import AnalysisOptions
from qkplast.rundir import derived, products
from qkplast.rundir.derived import (dataset_frame, frame_dataset, load_or_basis_dependence, load_or_null,
                                    load_or_pair_bounds, load_or_plasticity, load_or_pooling_table, load_or_slope_nulls)
from qkplast.capture_format import open_dataset, save_dataset
from qkplast.stats import nulls, shuffles
from qkplast.theory import checks
from qkplast.theory.planted import planted_capture


@pytest.fixture(scope="module")
def capture():
    return planted_capture(n_heads=3, dim=8, n_docs=4, samples_per_bucket=4, seed=7)[0]


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 has no pairs
        yield


@pytest.fixture
def fresh(monkeypatch):
    """No product read earlier in this process (products._read keeps them)."""
    monkeypatch.setattr(products, "_READ", {})


def refusing(real):
    """``real`` (its signature too, which a null's key reads) made to fail when called."""

    @functools.wraps(real)
    def refuse(*args, **kwargs):
        raise AssertionError(f"{real.__name__} computed again: the product should have been read back")

    return refuse


def test_a_null_is_computed_once_and_read_back(tmp_path, capture, monkeypatch, fresh):
    want = nulls.diagonal_null(capture, n_perm=15, seed=2, pairs_per_bucket=5)
    first = load_or_null(tmp_path, capture, "diagonal", n_perm=15, seed=2, pairs_per_bucket=5)
    assert (tmp_path / "null-diagonal.nc").exists()
    monkeypatch.setattr(nulls, "diagonal_null", refusing(nulls.diagonal_null))
    again = load_or_null(tmp_path, capture, "diagonal", n_perm=15, seed=2, pairs_per_bucket=5)
    for ds in (first, again):
        for name in want.data_vars:
            np.testing.assert_array_equal(ds[name].values, want[name].values)
        assert {k: v for k, v in ds.attrs.items() if k != "cache_key"} == want.attrs
        assert float(ds.p_value) == float(want.p_value)


def test_the_null_key_holds_every_setting_and_the_code(capture, monkeypatch):
    base = derived.null_key("bucket_shuffle", 100, 0, None)
    assert base["arguments"] == {"n_perm": 100, "pairs_per_bucket": 32, "seed": 0, "perm_chunk": 25}
    assert base["options"] == AnalysisOptions().result_key() and base["schema"] == derived.SCHEMA_VERSION
    assert set(base["provenance"]) == {"source_sha256", "versions", "machine"}
    for other in (derived.null_key("bucket_shuffle", 100, 1, None),
                  derived.null_key("bucket_shuffle", 100, 0, None, perm_chunk=20),  # other draws
                  derived.null_key("bucket_shuffle", 100, 0, AnalysisOptions(n_pairs=64)),
                  derived.null_key("independence", 100, 0, None)):
        assert other != base
    monkeypatch.setattr(qkplast.provenance, "source_digest", lambda *parts: "changed code")
    assert derived.null_key("bucket_shuffle", 100, 0, None)["provenance"]["source_sha256"] == "changed code"
    with pytest.raises(ValueError, match="null must be one of"):
        derived.null_key("nonsense", 10, 0, None)


def test_a_code_change_computes_the_product_again_in_its_file(tmp_path, capture, monkeypatch, fresh):
    load_or_null(tmp_path, capture, "independence", n_perm=6, pairs_per_bucket=4)
    calls = []
    real = nulls.independence_null

    @functools.wraps(real)
    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nulls, "independence_null", counting)
    load_or_null(tmp_path, capture, "independence", n_perm=6, pairs_per_bucket=4)
    assert not calls
    monkeypatch.setattr(derived, "product_provenance", lambda *parts, device: {"source_sha256": "edited"})
    load_or_null(tmp_path, capture, "independence", n_perm=6, pairs_per_bucket=4)
    assert len(calls) == 1 and [p.name for p in tmp_path.iterdir()] == ["null-independence.nc"]


def test_slope_nulls_are_read_back_as_the_two_nulls(tmp_path, capture, monkeypatch, fresh):
    sign = shuffles.key_slope_sign_null(capture, n_perm=12, seed=1)
    off = nulls.off_axis_null(capture, n_perm=12, seed=1)
    load_or_slope_nulls(tmp_path, capture, n_perm=12, seed=1)
    monkeypatch.setattr(shuffles, "slope_nulls", refusing(shuffles.slope_nulls))
    both = load_or_slope_nulls(tmp_path, capture, n_perm=12, seed=1)
    for name, alone in (("key_slope_sign", sign), ("off_axis", off)):
        assert both[name]["observed"] == alone["observed"]
        np.testing.assert_array_equal(both[name]["null"], alone["null"])


def test_plasticity_with_other_options_is_kept_per_setting(tmp_path, capture, fresh):
    full = load_or_plasticity(tmp_path, capture, covariance="full", seed=3, monte_carlo=False)
    prefix = load_or_plasticity(tmp_path, capture, pair_weight="prefix", seed=3)
    want = plasticity(capture, covariance="full", seed=3, monte_carlo=False)
    assert set(full.data_vars) == set(want.data_vars) and "ap_mc" not in full and "ap_mc" in prefix
    for name in want.data_vars:
        np.testing.assert_array_equal(full[name].values, want[name].values)
    assert len(list(tmp_path.glob("plasticity*.nc"))) == 2
    again = load_or_plasticity(tmp_path, capture, covariance="full", seed=3, monte_carlo=False)
    np.testing.assert_array_equal(again.ap_drop.values, want.ap_drop.values)


def test_pair_bounds_are_the_theory_page_s_numbers(tmp_path, capture, fresh):
    opt = AnalysisOptions(seed=1)
    metrics = plasticity(capture, opt)
    stats = pair_statistics(capture, options=opt)
    want = checks.aggregate_bound_for_heads(stats, metrics)
    d1, bounds = load_or_pair_bounds(tmp_path, capture, metrics, opt)
    np.testing.assert_array_equal(d1, np.abs(stats.delta1.values[stats.valid.values]))
    d1_again, again = load_or_pair_bounds(tmp_path, capture, metrics, opt)
    for table in (bounds, again):
        assert list(table.columns) == list(want.columns)
        pd.testing.assert_frame_equal(table, want, check_index_type=False, check_exact=True)
    np.testing.assert_array_equal(d1_again, d1)


def test_basis_dependence_and_pooling_come_back_as_their_tables(tmp_path, capture, fresh):
    want = checks.basis_dependence(capture, seed=2, heads=slice(0, 2))
    for _ in range(2):
        got = load_or_basis_dependence(tmp_path, capture, seed=2, heads=slice(0, 2))
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        assert got.index.name == "covariance" and got.index.dtype == want.index.dtype
    names = ["ap_overall", "ap_drop"]
    table, line = pooling_table(capture, names, seed=2)
    for _ in range(2):
        got, got_line = load_or_pooling_table(tmp_path, capture, names, seed=2)
        pd.testing.assert_frame_equal(got, table, check_exact=True)
        assert got_line == line


def test_a_frame_travels_through_a_file_unchanged(tmp_path):
    frame = pd.DataFrame({"a b": [1.5, np.nan, -2.0], "n": [1, 2, 3], "ok": [True, False, True], "s": ["x", "y", "z"]},
                         index=pd.Index(["p", "q", "r"], name="row name"))
    save_dataset(frame_dataset(frame, "t_"), tmp_path / "f.nc")
    pd.testing.assert_frame_equal(dataset_frame(open_dataset(tmp_path / "f.nc"), "t_"), frame, check_exact=True)
    plain = pd.DataFrame({"v": [0.1, 0.2]})
    save_dataset(frame_dataset(plain), tmp_path / "g.nc")
    pd.testing.assert_frame_equal(dataset_frame(open_dataset(tmp_path / "g.nc")), plain, check_index_type=False)
