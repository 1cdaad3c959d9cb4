"""Bootstrap over documents: replicates are proper document resamples; intervals separate a planted decay
from none."""

import numpy as np
import pytest

from qkplast.bootstrap import METRICS, bootstrap, model_level, resample_documents
from qkplast.options import AnalysisOptions
from qkplast.synthetic import planted_capture


@pytest.fixture(scope="module")
def cap():
    return planted_capture(n_heads=3, dim=8, seq_len=2048, bucket_size=256, n_docs=16, samples_per_bucket=3, seed=2)[0]


def test_resample_keeps_documents_whole_and_copies_distinct(cap, rng):
    rep = resample_documents(cap, rng)
    docs = np.unique(cap.doc.values)
    new = np.unique(rep.doc.values)
    assert len(new) == len(docs)  # as many copies as documents, each with its own id
    for d in new:
        base = d.split("#")[0]
        np.testing.assert_array_equal(np.sort(rep.position.values[rep.doc.values == d]),
                                      np.sort(cap.position.values[cap.doc.values == base]))


def test_intervals_and_estimate(cap):
    b = bootstrap(cap, n_boot=12, seed=1, n_pairs=64)
    assert list(b.metric.values) == list(METRICS) and b.replicates.shape == (len(METRICS), 12)
    full = model_level(cap, AnalysisOptions(n_pairs=64))
    np.testing.assert_allclose(b.estimate.values, [full[m] for m in METRICS])
    assert (b.lo <= b.hi).all() and (b.se > 0).all()
    np.testing.assert_allclose(b.lo + b.hi, 2 * b.estimate - b.lo_percentile - b.hi_percentile + 2 * b.estimate,
                               rtol=1e-12)
    again = bootstrap(cap, n_boot=12, seed=1, n_pairs=64)
    np.testing.assert_array_equal(b.replicates, again.replicates)


def test_planted_decay_is_resolved_and_no_drift_is_not():
    strong = planted_capture(n_heads=2, dim=8, seq_len=2048, bucket_size=256, n_docs=16, samples_per_bucket=3,
                             beta_pos=4e-3, key_slope=3e-3, seed=3)[0]
    flat = planted_capture(n_heads=2, dim=8, seq_len=2048, bucket_size=256, n_docs=16, samples_per_bucket=3,
                           beta_pos=1e-9, key_slope=0.0, seed=3)[0]
    s = bootstrap(strong, n_boot=20, seed=0, n_pairs=64).sel(metric="ap_drop")
    f = bootstrap(flat, n_boot=20, seed=0, n_pairs=64).sel(metric="ap_drop")
    assert float(s.lo) > 0.1
    assert float(f.lo) < 0 < float(f.hi)


def test_bad_arguments(cap):
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap(cap, n_boot=1)
    with pytest.raises(ValueError, match="level"):
        bootstrap(cap, n_boot=5, level=1.5)
    one = cap.isel(sample=np.flatnonzero(cap.doc.values == cap.doc.values[0]))
    with pytest.raises(ValueError, match="at least two documents"):
        bootstrap(one, n_boot=5)
