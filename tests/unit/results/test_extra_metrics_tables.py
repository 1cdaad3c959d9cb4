"""The tables of the open-questions chapter (qkplast.results.extra_metrics): numbers, not strings; intervals inside
their ranges; the GQA reading against the keys-kept null's distribution; coverage on planted worlds at the
chapter's 4 documents."""

import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import qkplast.analysis.listwise as listwise_module
import qkplast.stats.permutation_tests as permutation_tests
from qkplast.analysis.gqa import cross_profiles
from qkplast.analysis.metrics import analyze
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.options import AnalysisOptions
from qkplast.results import extra_metrics as op
from qkplast.stats.decision import verdict
from qkplast.theory.planted import planted_capture

N_DOCS = 4  # the chapter's documents (the embedded run's capture)


# --------------------------------------------------------------------------- planted captures


def grouped(queries_shared: bool, seed: int = 2):
    """A planted capture whose GQA groups share their keys (as in a capture) and, if asked, their queries too."""
    cap, _ = planted_capture(n_heads=18, dim=8, n_docs=5, samples_per_bucket=6, seed=seed, doc_effect=0.3, world_seed=3)
    k, q = cap.k.values.copy(), cap.q.values.copy()
    group = cap.layer.values * 100 + cap.kv_head.values
    for g in np.unique(group):
        idx = np.flatnonzero(group == g)
        k[idx] = k[idx[0]]
        if queries_shared:  # coordination beyond the keys: a group's heads read alike
            q[idx] = q[idx[0]] + 0.05 * np.random.default_rng(int(g)).standard_normal(q[idx].shape)
    cap = cap.assign(k=(cap.k.dims, k), q=(cap.q.dims, q))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        return cap, analyze(cap, set_sizes=(2,), n_pairs=64)


@pytest.fixture(scope="module")
def coordinated():
    return grouped(True)


@pytest.fixture(scope="module")
def independent():
    return grouped(False)


def test_listwise_table_keeps_numbers_inside_their_ranges():
    cap, _ = planted_capture(n_heads=6, dim=8, seq_len=1024, bucket_size=64, n_docs=N_DOCS, samples_per_bucket=4,
                             seed=4, doc_effect=0.3, world_seed=5)
    opt = AnalysisOptions(set_sizes=(2, 8), n_pairs=32, n_sets=8, n_model_queries=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        metrics = analyze(cap, opt)
        t = op.listwise_document_intervals(cap, metrics, opt, n_perm=19)
    for label, (lo_range, hi_range) in (("model", (0, 1)), ("captured", (0, 1)), ("rho", (-1, 1))):
        lo, hi = t[f"{label} lo"].dropna(), t[f"{label} hi"].dropna()
        assert lo.dtype == float and hi.dtype == float and len(lo) > 0, label
        assert (lo_range <= lo).all() and (lo <= hi).all() and (hi <= hi_range).all(), (label, t)
    assert np.isnan(t.loc[2, "rho"]) and "logit" in t.attrs["method"] and "4 documents" in t.attrs["method"]


def test_listwise_intervals_leave_the_correlation_open_with_too_few_heads():
    """Two heads cannot rank: rho and its permutation p are NaN (a tiny model), the means still get intervals."""
    cap, _ = planted_capture(n_heads=2, dim=8, n_docs=N_DOCS, samples_per_bucket=6, seed=4, doc_effect=0.3,
                             world_seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        metrics = analyze(cap, set_sizes=(2, 8), n_pairs=32)
        t = op.listwise_document_intervals(cap, metrics, n_perm=19)
    assert np.isnan(t.loc[8, "rho"]) and np.isnan(t.loc[8, "p_perm"]) and np.isnan(t.loc[8, "rho lo"])
    assert np.isfinite(t.loc[2, "model"]) and np.isfinite(t.loc[2, "model lo"]) and "4 documents" in t.attrs["method"]


def test_the_correlations_interval_stays_inside_minus_one_one(independent, monkeypatch):
    """rho's jackknife-t runs on Fisher's z and maps back: with leave-out correlations this spread near 1, an
    interval on rho's own scale would pass 1."""
    cap, _ = independent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        metrics = analyze(cap, set_sizes=(2, 8), n_pairs=32)
    means = {(m, name): 0.5 for m in (2, 8) for name in ("ap_set", "ap_set_mc")}
    # the whole capture's, each left-out document's, then each left-out pair's (5 documents: the policy's second level)
    rhos = iter([0.95, 0.99, 0.3, 0.98, 0.97, 0.2, 0.99, 0.4, 0.97, 0.96, 0.35, 0.98, 0.97, 0.25, 0.3, 0.96])
    monkeypatch.setattr(listwise_module, "listwise", lambda capture, options: None)
    monkeypatch.setattr(listwise_module, "listwise_means", lambda lw: {**means, (8, "rho"): next(rhos)})
    monkeypatch.setattr(permutation_tests, "pairwise_predicts_listwise", lambda *a, **k: {"p_perm": 0.5})
    t = op.listwise_document_intervals(cap, metrics, n_perm=19)
    with pytest.raises(StopIteration):  # every left-out value was read: 1 + 5 + 10
        next(rhos)
    lo, hi = t.loc[8, "rho lo"], t.loc[8, "rho hi"]
    assert -1.0 <= lo <= hi <= 1.0 and t.loc[8, "rho"] == pytest.approx(0.95)


def test_nearest_mass_intervals_are_numeric_and_inside_zero_one(independent):
    _, metrics = independent
    near = op.nearest_mass_intervals(metrics)
    for label in ("positional term alone", "full scores", "equal scores"):
        lo, hi = near[f"{label} lo"], near[f"{label} hi"]
        ok = lo.notna()
        assert ok.any() and ((0 < lo[ok]) & (lo[ok] <= near[label][ok]) & (near[label][ok] <= hi[ok]) & (hi[ok] < 1)).all()


def test_gqa_reading_is_decided_against_the_keys_kept_null(coordinated, independent):
    rows = {}
    for name, (cap, metrics) in (("coordinated", coordinated), ("independent", independent)):
        opt = AnalysisOptions(n_pairs=64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlasticityWarning)
            g = op.gqa_reading(cap, metrics, opt, n_perm=199)
        r = g.iloc[0]
        null = g.attrs["key_null"]
        assert r["contrast"] == pytest.approx(r["T"] - null.mean())  # against the null's mean, not 0
        assert (r["key null lo"], r["key null hi"]) == pytest.approx(tuple(np.quantile(null, [0.025, 0.975])))
        assert r["p (keys kept)"] == pytest.approx((1 + np.sum(null <= r["T"])) / 200)
        # the contrast's interval is over documents of the contrast itself: each left-out capture with its own null
        # mean (by hand for the first document), not T's interval shifted by the whole capture's null mean
        jack = g.attrs["jackknife"]  # [document, (T, contrast)]
        doc0 = np.unique(cap.doc.values)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlasticityWarning)
            sub = cap.isel(sample=np.flatnonzero(cap.doc.values != doc0))
            keys0 = permutation_tests.gqa_key_null(metrics, cross_profiles(sub, opt), n_perm=199, seed=0)
        assert jack[0] == pytest.approx([float(keys0.statistic), float(keys0.statistic - keys0.null_mean)])
        null_means = jack[:, 0] - jack[:, 1]
        assert np.ptp(null_means) > 0, "the null's mean varies over documents: the interval must carry it"
        assert r["contrast lo"] < r["contrast hi"] and r["T lo"] <= r["T"] <= r["T hi"]
        assert 0 < r["p (labels permuted)"] <= 1
        assert r["within group"] - r["between groups"] == pytest.approx(r["T"])
        rows[name] = verdict(r["contrast"], r["contrast lo"], r["contrast hi"], r["p (keys kept)"], claim="less")
    # shared queries make a group alike beyond its keys; shared keys alone do not pass
    assert rows == {"coordinated": "supported", "independent": "left open"}, rows


def test_the_chapters_products_are_kept_and_read_back(coordinated, tmp_path, monkeypatch):
    """With a store the GQA reading, the listwise intervals and the decomposition table read their left-out values
    back on a second call (the batched kernels and the listwise analysis are not called again) and equal the tables
    computed without one."""
    import qkplast.analysis.decompose as decompose
    import qkplast.analysis.gqa as gqa
    from qkplast.results.tables import decomposition_table
    from qkplast.rundir import product_store

    cap, metrics = coordinated
    opt = AnalysisOptions(n_pairs=64, set_sizes=(2, 8))
    store = product_store(tmp_path)
    calls = []
    for module, name in ((gqa, "cross_profiles_of_cuts"), (decompose, "model_level_terms_of_cuts"),
                         (listwise_module, "listwise")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        tables = lambda **kw: (op.gqa_reading(cap, metrics, opt, n_perm=99, **kw),  # noqa: E731
                               op.listwise_document_intervals(cap, metrics, opt, n_perm=19, **kw),
                               decomposition_table(cap, metrics, opt, **kw))
        first = tables(store=store)
        made = len(calls)
        again = tables(store=store)
        assert len(calls) == made, "a second call reads every left-out value back"
        plain = tables()
    for a, b, c in zip(first, again, plain):
        pd.testing.assert_frame_equal(a, b)
        pd.testing.assert_frame_equal(a, c)
    assert {p.name for p in tmp_path.glob("*.nc")} == {"gqa-key-null.nc", "gqa-jackknife.nc", "listwise-jackknife.nc",
                                                       "decomposition-jackknife.nc"}


# --------------------------------------------------------------------------- coverage at the chapter's 4 documents


def beta_world(mean: float, sd: float) -> tuple[float, float]:
    k = mean * (1 - mean) / sd**2 - 1
    return mean * k, (1 - mean) * k


#: listwise means: (mean, sd across documents) like the chapter's set sizes 8, 64 and the whole set (the sd of
#: its documents implied by the intervals it printed: 0.10, 0.16, 0.30), and one near 1
LISTWISE_WORLDS = [(0.687, 0.10), (0.796, 0.16), (0.636, 0.30), (0.9, 0.08)]
#: nearest mass: the chapter's full scores at buckets 3 and 8 (sd 0.24, 0.19), the positional term's small masses
MASS_WORLDS = [(0.366, 0.24), (0.288, 0.19), (0.063, 0.023), (0.9, 0.08)]
REPLICATES = 2000  # binomial standard error of a coverage near 0.95: 0.005 (0.007 for the listwise worlds' 1000)


class _Left:
    """What the stand-in of ``listwise`` returns: the documents of the capture it was given."""

    def __init__(self, docs):
        self.docs = docs


def test_coverage_of_the_listwise_means_interval(monkeypatch):
    """The chapter's listwise-mean interval (op.listwise_document_intervals: the policy's jackknife on the logit
    scale) covers a planted mean at 4 documents. Each "set size" is one replicate: its estimate is the
    set-weighted mean over the documents kept (the pooled estimator's form), the documents' values drawn from a
    Beta law around the world's mean, their numbers of sets from a Poisson law."""
    rng = np.random.default_rng(11)
    coverage = {}
    for mean, sd in LISTWISE_WORLDS:
        a, b = beta_world(mean, sd)
        x = rng.beta(a, b, (REPLICATES // 2, N_DOCS))
        w = rng.poisson(30, (REPLICATES // 2, N_DOCS)) + 1.0
        sizes = np.arange(3, REPLICATES // 2 + 3)

        def means(arg, x=x, w=w, sizes=sizes):
            keep = np.arange(N_DOCS) if isinstance(arg, xr.Dataset) else np.asarray(arg.docs)
            est = (w[:, keep] * x[:, keep]).sum(1) / w[:, keep].sum(1)
            return {**{(int(m), n): float(e) for m, e in zip(sizes, est) for n in ("ap_set", "ap_set_mc")},
                    **{(int(m), "rho"): np.nan for m in sizes}}

        monkeypatch.setattr(listwise_module, "listwise", lambda capture, options: _Left(np.unique(capture.doc.values)))
        monkeypatch.setattr(listwise_module, "listwise_means", means)
        capture = xr.Dataset(coords={"doc": ("sample", np.arange(N_DOCS))})
        metrics = xr.Dataset({"n_sets": (("set_size", "query_bucket"), np.ones((len(sizes), 1)))},
                             coords={"set_size": sizes})
        t = op.listwise_document_intervals(capture, metrics, AnalysisOptions(), n_perm=19)
        assert ((0 <= t["model lo"]) & (t["model hi"] <= 1)).all()
        coverage[(mean, sd)] = float(((t["model lo"] <= mean) & (mean <= t["model hi"])).mean())
    print("coverage of the listwise means' interval at 4 documents:", coverage)
    assert min(coverage.values()) >= 0.9, coverage


def test_coverage_of_the_nearest_mass_interval():
    """The chapter's nearest-mass interval (op.nearest_mass_intervals: Student's t on the logit scale) covers a
    planted mean mass at 4 documents; each query bucket is one replicate."""
    rng = np.random.default_rng(12)
    coverage = {}
    for mean, sd in MASS_WORLDS:
        a, b = beta_world(mean, sd)
        v = rng.beta(a, b, (1, REPLICATES, N_DOCS))  # [head, bucket, document]
        metrics = xr.Dataset({"nearest_mass_doc": (("head", "query_bucket", "document"), v),
                              "nearest_mass_position_doc": (("head", "query_bucket", "document"), v),
                              "nearest_share_doc": (("query_bucket", "document"), v[0])},
                             coords={"query_bucket": np.arange(REPLICATES)})
        near = op.nearest_mass_intervals(metrics)
        lo, hi = near["full scores lo"], near["full scores hi"]
        assert ((0 <= lo) & (hi <= 1)).all()
        coverage[(mean, sd)] = float(((lo <= mean) & (mean <= hi)).mean())
    print("coverage of the nearest-mass interval at 4 documents:", coverage)
    assert min(coverage.values()) >= 0.9, coverage


def test_the_old_intervals_left_the_range_in_these_worlds():
    """The worlds are the chapter's: Student's t on the raw scale leaves [0, 1] in them (the issue's
    [-0.015, 0.747]), which is what the logit scale repairs."""
    from qkplast.stats.intervals import t_interval

    a, b = beta_world(*MASS_WORLDS[0])
    v = np.random.default_rng(13).beta(a, b, (N_DOCS, REPLICATES))
    raw = t_interval(v)
    assert np.mean(raw["lo"] < 0) > 0.05


def test_tables_hold_no_formatted_strings(independent):
    cap, metrics = independent
    near = op.nearest_mass_intervals(metrics)
    assert all(pd.api.types.is_float_dtype(near[c]) for c in near.columns)
