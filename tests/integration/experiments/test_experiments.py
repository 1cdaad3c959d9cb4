"""The intervention grid on a tiny model: conditions, matched nulls on every cell, mean ablation, the functional
check, the k pilot, readings, calibration and held-out manipulation checks with their matched null, the caches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkplast.experiments.head_interventions as qx
import qkplast.stats.intervention_readings as qs
from qkplast.analysis.metrics import analyze
from qkplast.capture.corpus import Document
from qkplast.capture.driver import capture
from qkplast.experiments.behavior import CopyDesign, document_windows
from qkplast.experiments.calibrate import capture_windows
from qkplast.experiments.intervene import InterventionError
from qkplast.options import CaptureOptions
from tests.helpers import tiny_model, tiny_tokenizer

DESIGN = CopyDesign(window=96, seg_len=6, positions=(44, 88), distances=(10, 30), matched_context=True)
REG = qs.load_readings()


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
    return model, tok, cap, metrics, windows, ids, options


def test_grid_end_to_end_on_a_tiny_model(setup, tmp_path):
    model, tok, cap, metrics, windows, ids, options = setup
    assert not set(ids) & set(qx.geometry_documents(cap))  # the behaviour reads other documents
    total, n_cal, n_check = qx.geometry_plan(4, 4)
    docs = qx.geometry_documents(cap)
    cal = qx.load_or_calibrate(tmp_path, model, tok, _docs(), cap, metrics, ks=[3], calibration_docs=docs[:n_cal])
    assert set(cal) == {("key", 3), ("query", 3)}
    pilot_ids, _ = capture_windows(tok, [d for d in _docs() if d.id in docs[:n_cal]], options)
    reference = qx.load_or_mean_outputs(tmp_path, model, list(pilot_ids), metrics)
    pilot = qx.load_or_pilot(tmp_path, model, tok, list(pilot_ids), DESIGN, metrics, candidates=[2, 4], n_sets=2,
                             fraction=0.5, reference=reference)
    assert pilot.nll.shape == (2, 2) and pilot.attrs["chosen"] in (2, 4)
    assert pilot.attrs["threshold"] == pytest.approx(0.5 * np.log(model.config.vocab_size))
    params = dict(design=DESIGN, ks=[3], n_null=3, calibrated=cal, ablation="mean", reference=reference)
    grid = qx.load_or_run_grid(tmp_path, model, tok, windows, metrics, **params)
    again = qx.load_or_run_grid(tmp_path, model, tok, windows, metrics, **params)
    np.testing.assert_array_equal(grid.nll.values, again.nll.values)  # from the cache
    kinds = list(grid.kind.values)
    assert kinds == (["none", "lowest"] + ["null lowest"] * 3 + ["highest"] + ["null highest"] * 3
                     + ["clamp key", "clamp query"] + ["null clamp key"] * 3)
    assert grid.attrs["ablation"] == "mean" and grid.attrs["vocab"] == model.config.vocab_size
    ap = {(int(a), int(b)): v for a, b, v in zip(metrics.layer.values, metrics.q_head.values, metrics.ap_last20.values)}
    low = qx.parse_heads(str(grid.heads.values[1]))
    assert max(ap[h] for h in low) <= np.nanmin([v for h, v in ap.items() if h not in low])
    for text in grid.heads.values[2:5]:
        assert sorted(la for la, _ in qx.parse_heads(str(text))) == sorted(la for la, _ in low)
    # every null set measures every cell now (the distance contrast has a null)
    assert np.isfinite(grid.nll.sel(condition=grid.kind.str.startswith("null"))).all()
    np.testing.assert_array_equal(qs.cell_effects(grid).sel(condition=grid.kind == "none"), 0.0)
    check = qs.functional_check(grid, 0.5)
    assert len(check) == grid.sizes["condition"] and check.attrs["threshold"] == pytest.approx(0.5 * np.log(300))
    assert (check.working == (check["mean NLL"] < check.attrs["threshold"])).all()
    # mean ablation differs from zero ablation on the ablated conditions, not on the unablated model (two sequences
    # per forward pass here: the same values up to float rounding)
    zero = qx.run_grid(model, tok, windows, metrics, design=DESIGN, ks=[3], n_null=2, calibrated=cal, batch_size=2)
    assert zero.attrs["ablation"] == "zero"
    np.testing.assert_allclose(zero.nll.values[0], grid.nll.values[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(zero.nll.values[1], grid.nll.values[1])
    with pytest.raises(InterventionError, match="ablation must be"):
        qx.run_grid(model, tok, windows, metrics, design=DESIGN, ks=[3], n_null=2, ablation="mean")
    heads = qx.parse_heads(str(grid.heads.sel(condition=grid.kind == "clamp key").values[0]))
    analysis = {"n_pairs": 32, "open_questions": False}
    checks = qx.load_or_manipulation_checks(tmp_path, model, tok, _docs(), cap, metrics, heads,
                                            calibrated={m: cal[(m, 3)] for m in ("key", "query")},
                                            check_docs=docs[n_cal:], analysis=analysis)
    assert set(checks["mode"]) == {"key", "query"} and len(checks) == 2 * len(heads)
    conds = [c for c in qx.interventions(metrics, [3], 3, 0, calibrated=cal) if c.kind == "null clamp key"]
    assert [qx.format_heads(c.heads) for c in conds] == list(grid.heads.values[grid.kind == "null clamp key"])
    null = qx.load_or_null_clamp_plasticity(tmp_path, model, tok, _docs(), cap, metrics, conds, check_docs=docs[n_cal:][:1],
                                            analysis=analysis)
    assert null.change.shape == (3,) and np.isfinite(null.change).all()
    plasticity = {"target": qs.plasticity_change(checks), "null": null.change.values}
    # a random-initialised model copies at chance (NLL about ln V): every condition fails the registered check, and
    # every reading is gated
    gated = qs.readings(grid, REG, plasticity=plasticity)
    assert list(gated.key) == list(REG["readings"]) and not check.working.any()
    assert (gated.verdict == "not testable (gate: model broken)").all() and gated.p.isna().all()
    # with a threshold the chance-level model passes, the same grid is read: one Holm family of five
    table = qs.readings(grid, dict(REG, working_fraction=2.0), plasticity=plasticity)
    assert table.gate.isna().all() and table.attrs["m"] == 5
    assert set(table.verdict) <= {"supported", "contradicted", "left open", "no effect"}
    assert np.allclose(table["p floor"], 1 / 4) and (table.lo <= table.hi).all() and (table.detectable > 0).all()
    plain = analyze(cap.isel(sample=np.isin(cap.doc.values, docs[n_cal:])), n_pairs=32, open_questions=False)
    rows = [int(np.flatnonzero((plain.layer.values == la) & (plain.q_head.values == h))[0]) for la, h in heads]
    for mode in ("key", "query"):
        np.testing.assert_allclose(checks[checks["mode"] == mode]["bias_strength plain"], plain.bias_strength.values[rows])
    geo = qx.geometry_at_copies(metrics, heads, DESIGN)
    assert list(geo.index) == ["selected heads", "all heads"] and geo.shape[1] == 3


def test_null_clamps_are_the_targeted_edit_calibrated_on_their_own_heads(setup, tmp_path):
    model, tok, cap, metrics, _, _, _ = setup
    docs, n_cal = qx.geometry_documents(cap), qx.geometry_plan(4, 4)[1]
    cal = qx.load_or_calibrate(tmp_path, model, tok, _docs(), cap, metrics, ks=[3], calibration_docs=docs[:n_cal],
                               n_null=2)
    nulls = [c for c in qx.interventions(metrics, [3], 2, 0, calibrated=cal) if c.kind == "null clamp key"]
    targeted = [c for c in qx.interventions(metrics, [3], 2, 0) if c.kind == "clamp key"][0]
    assert len(nulls) == 2 and {("key", 3), ("query", 3), ("null key", 3, 0), ("null key", 3, 1)} == set(cal)
    for c in nulls:
        assert c.clamp is cal[("null key", 3, c.draw)]  # its own calibration, not the plain metrics
        assert sorted({la for la, _ in c.heads}) == sorted({la for la, _ in targeted.heads})  # the same layers
        # each null clamp calibrates the drift of its own heads: the same procedure as the targeted clamp
        own = qx.clamp_size(c.clamp, c.heads)
        assert own.shape == (3,) and np.isfinite(own).all() and (own > 0).all()
    # the cache holds the null clamps under their own labels: a reload gives the same arrays
    again = qx.load_or_calibrate(tmp_path, model, tok, _docs(), cap, metrics, ks=[3], calibration_docs=docs[:n_cal],
                                 n_null=2)
    np.testing.assert_array_equal(again[("null key", 3, 1)].alpha_k.values, cal[("null key", 3, 1)].alpha_k.values)
    uncalibrated = [c for c in qx.interventions(metrics, [3], 2, 0) if c.kind == "null clamp key"]
    assert all(c.clamp is metrics for c in uncalibrated)


def test_the_design_must_match_the_geometry_window(setup):
    _, _, _, metrics, _, _, _ = setup
    with pytest.raises(Exception, match="96-token windows"):
        qx.geometry_at_copies(metrics, [(0, 0)], CopyDesign())
