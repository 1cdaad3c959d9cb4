"""The intervention grid on a tiny model: conditions, matched nulls, cells, readings, calibration and held-out
manipulation checks, the caches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkplast.experiments.grid as qx
from qkplast.analysis.metrics import analyze
from qkplast.capture.corpus import Document
from qkplast.capture.driver import capture
from qkplast.experiments.behavior import CopyDesign, document_windows
from qkplast.experiments.intervene import InterventionError
from qkplast.options import CaptureOptions
from tests.helpers import tiny_model, tiny_tokenizer

DESIGN = CopyDesign(window=96, seg_len=6, positions=(44, 88), distances=(10, 30))


def _docs():
    from pydoc_data.topics import topics

    return [Document(name, topics[name]) for name in sorted(topics, key=lambda n: (-len(topics[n]), n))[:12]]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(1)
    model, tok = tiny_model("llama"), tiny_tokenizer()
    options = CaptureOptions(seq_len=96, bucket_size=6, samples_per_bucket=4, heads=None, docs=4, short_docs="skip")
    cap = capture(model, tok, _docs(), options=options, progress=False)
    metrics = analyze(cap, n_pairs=32, open_questions=False)
    windows, ids = document_windows(_docs(), tok, 96, 4, skip=4)
    return model, tok, cap, metrics, windows, ids


def test_grid_end_to_end_on_a_tiny_model(setup, tmp_path):
    model, tok, cap, metrics, windows, ids = setup
    assert not set(ids) & set(qx.geometry_documents(cap))  # the behaviour reads other documents
    total, n_cal, n_check = qx.geometry_plan(4, 4)
    docs = qx.geometry_documents(cap)
    cal = qx.load_or_calibrate(tmp_path, model, tok, _docs(), cap, metrics, ks=[3], calibration_docs=docs[:n_cal])
    assert set(cal) == {("key", 3), ("query", 3)}
    grid = qx.load_or_run_grid(tmp_path, model, tok, windows, metrics, design=DESIGN, ks=[3], n_null=4, calibrated=cal)
    again = qx.load_or_run_grid(tmp_path, model, tok, windows, metrics, design=DESIGN, ks=[3], n_null=4, calibrated=cal)
    np.testing.assert_array_equal(grid.nll.values, again.nll.values)  # from the cache
    # two sequences per forward pass: the same cells up to float rounding, and a cache entry of its own
    batched = qx.load_or_run_grid(tmp_path, model, tok, windows, metrics, design=DESIGN, ks=[3], n_null=4,
                                  calibrated=cal, batch_size=2)
    np.testing.assert_allclose(batched.nll.values, grid.nll.values, rtol=1e-5, atol=1e-6)
    assert len(list(tmp_path.glob("interventions*"))) == 2
    assert grid.nll.dims == ("condition", "window", "position", "distance")
    kinds = list(grid.kind.values)
    assert kinds == ["none", "lowest"] + ["null lowest"] * 4 + ["highest"] + ["null highest"] * 4 + ["clamp key",
                                                                                                 "clamp query"]
    # the lowest set is the 3 heads with the smallest ap_last20, and each null set has its layer mix
    ap = {(int(a), int(b)): v for a, b, v in zip(metrics.layer.values, metrics.q_head.values, metrics.ap_last20.values)}
    low = qx.parse_heads(str(grid.heads.values[1]))
    assert max(ap[h] for h in low) <= np.nanmin([v for h, v in ap.items() if h not in low])
    for text in grid.heads.values[2:6]:
        assert sorted(la for la, _ in qx.parse_heads(str(text))) == sorted(la for la, _ in low)
    # a null set measures only the first sequence's cells; the targeted conditions all of them
    null = grid.nll.sel(condition=grid.kind == "null lowest").isel(condition=0)
    assert np.isnan(null.sel(position=44, distance=30)).all() and np.isfinite(null.sel(position=44, distance=10)).all()
    assert np.isfinite(grid.nll.sel(condition=grid.kind == "lowest")).all()
    # the unablated model sees the same windows and segments in every condition: none minus none is 0
    np.testing.assert_array_equal(qx.cell_effects(grid).sel(condition=grid.kind == "none"), 0.0)
    table = qx.readings(grid)
    assert len(table) == 4 and set(table.verdict) <= {"supported", "contradicted", "left open", "no effect"}
    # null sets on the first two windows only: their cells there are the full grid's (the same segments), the
    # targeted conditions still run every window
    part = qx.run_grid(model, tok, windows, metrics, design=DESIGN, ks=[3], n_null=4, calibrated=cal, null_windows=2)
    nulls = part.kind.str.startswith("null").values
    np.testing.assert_array_equal(part.nll.values[nulls, :2], grid.nll.values[nulls, :2])
    assert np.isnan(part.nll.values[nulls, 2:]).all() and part.attrs["null_windows"] == 2
    np.testing.assert_array_equal(part.nll.values[~nulls], grid.nll.values[~nulls])
    assert len(qx.readings(part)) == 4
    with pytest.raises(InterventionError, match="null_windows must be between 2 and the 4"):
        qx.run_grid(model, tok, windows, metrics, design=DESIGN, ks=[3], n_null=4, null_windows=5)
    assert np.allclose(table.loc[table.measure.str.contains("matched"), "p floor"], 1 / 5)
    heads = qx.parse_heads(str(grid.heads.sel(condition=grid.kind == "clamp key").values[0]))
    checks = qx.load_or_manipulation_checks(tmp_path, model, tok, _docs(), cap, metrics, heads,
                                            calibrated={m: cal[(m, 3)] for m in ("key", "query")},
                                            check_docs=docs[n_cal:], analysis={"n_pairs": 32, "open_questions": False})
    assert set(checks["mode"]) == {"key", "query"} and len(checks) == 2 * len(heads)
    for col in ("bias_strength clamped", "key_position_slope clamped", "ap_last20 clamped"):
        assert np.isfinite(checks[col]).all()
    # the plain columns are the capture's own analysis on the held-out documents, the same for both modes
    plain = analyze(cap.isel(sample=np.isin(cap.doc.values, docs[n_cal:])), n_pairs=32, open_questions=False)
    rows = [int(np.flatnonzero((plain.layer.values == la) & (plain.q_head.values == h))[0]) for la, h in heads]
    for mode in ("key", "query"):
        np.testing.assert_allclose(checks[checks["mode"] == mode]["bias_strength plain"], plain.bias_strength.values[rows])
    geo = qx.geometry_at_copies(metrics, heads, DESIGN)
    assert list(geo.index) == ["selected heads", "all heads"] and geo.shape[1] == 3


def test_the_design_must_match_the_geometry_window(setup):
    _, _, _, metrics, _, _ = setup
    with pytest.raises(Exception, match="96-token windows"):
        qx.geometry_at_copies(metrics, [(0, 0)], CopyDesign())
