"""The intervention grid: conditions, paired bootstrap, effect table and verdicts, on a tiny model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import qkplast.experiments.grid as qx
from qkplast.analysis.metrics import analyze
from qkplast.capture.driver import capture
from qkplast.options import CaptureOptions
from qkplast.errors import QkplastError
from tests.helpers import tiny_model, tiny_tokenizer, topic_documents


def _docs():
    return topic_documents("assert", "for", "if", "while", "try", "with")


def test_paired_bootstrap_is_the_mean_of_resampled_windows():
    values = np.random.default_rng(0).normal(size=(3, 7))  # [row, window]
    reps = qx.paired_bootstrap(values, n_boot=50, seed=4)
    assert reps.shape == (50, 3)
    g = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 7, (50, 7), generator=g).numpy()
    np.testing.assert_allclose(reps, values[:, idx].mean(-1).T)
    # pairing: the difference of two rows' replicates is the replicate of their difference
    diff = qx.paired_bootstrap(values[0] - values[1], n_boot=50, seed=4)
    np.testing.assert_allclose(diff, reps[:, 0] - reps[:, 1])


def test_two_level_bootstrap_resamples_draws_and_windows():
    values = np.random.default_rng(1).normal(size=(4, 6))  # [draw, window]
    reps = qx.paired_bootstrap(values, n_boot=30, seed=2, draws=True)
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 6, (30, 6), generator=g).numpy()
    didx = torch.randint(0, 4, (30, 4), generator=g).numpy()
    want = [values[didx[r]][:, idx[r]].mean() for r in range(30)]
    np.testing.assert_allclose(reps, want)
    same = np.broadcast_to(values[0], (4, 6))  # identical draws: the same as resampling windows only
    np.testing.assert_allclose(qx.paired_bootstrap(same, 30, 2, draws=True), qx.paired_bootstrap(values[0], 30, 2))


def test_verdicts_follow_the_interval():
    assert qx._verdict(-0.3, -0.1, -1) == "supported"
    assert qx._verdict(0.1, 0.3, -1) == "contradicted"
    assert qx._verdict(-0.1, 0.2, -1) == "left open"


def test_calibrated_grid_and_geometry_on_a_tiny_model(tmp_path):
    """Calibrated clamps: cached per (mode, k), used by the grid, and every clamped head of every layer loses its
    bias on re-capture (the plain clamp leaves some above the lowest clamped layer)."""
    torch.manual_seed(1)
    model, tok = tiny_model("llama"), tiny_tokenizer()
    options = CaptureOptions(seq_len=64, bucket_size=8, samples_per_bucket=4, heads=None, docs=4, short_docs="concat")
    cap = capture(model, tok, _docs(), options=options, progress=False)
    metrics = analyze(cap, n_pairs=32)
    cal = qx.load_or_calibrate(tmp_path, model, tok, _docs(), cap, metrics, ks=[4], docs=4)
    assert set(cal) == {("query", 4), ("key", 4)}
    again = qx.load_or_calibrate(tmp_path, model, tok, _docs(), cap, metrics, ks=[4], docs=4)  # from the cache
    np.testing.assert_array_equal(again[("key", 4)].key_drift.values, cal[("key", 4)].key_drift.values)
    heads = [tuple(map(int, h)) for h in cal[("query", 4)].attrs["clamp_calibration"]["heads"]]
    assert len({la for la, _ in heads}) > 1  # several layers: the calibration has something to do
    grid = qx.run_grid(model, tok, _docs(), metrics, ks=[4], n_random=1, distances=[8], windows=2, seq_len=64,
                       seg_len=6, calibrated=cal)
    plain = qx.run_grid(model, tok, _docs(), metrics, ks=[4], n_random=1, distances=[8], windows=2, seq_len=64,
                        seg_len=6)
    clamp = grid.kind == "clamp query"
    assert grid.attrs["clamp_calibrated"] and not plain.attrs["clamp_calibrated"]
    assert not np.array_equal(grid.nll.sel(condition=clamp).values, plain.nll.sel(condition=clamp).values)
    geometry, _ = qx.clamp_geometry(model, tok, _docs(), cap, metrics, heads, docs=4, analysis={"n_pairs": 32},
                                    calibrated={m: cal[(m, 4)] for m in ("query", "key")})
    uncalibrated, _ = qx.clamp_geometry(model, tok, _docs(), cap, metrics, heads, docs=4, analysis={"n_pairs": 32})
    assert (geometry["residual |bias| ratio"] < 1e-3).all(), geometry
    assert uncalibrated["residual |bias| ratio"].max() > 100 * geometry["residual |bias| ratio"].max()


def test_geometry_from_the_calibrating_pass_equals_a_separate_re_capture(tmp_path):
    """``recapture=True``: the clamps of the largest k capture in their calibrating pass, the geometry reads those
    captures, and its table equals the one from a second pass inside the calibrated clamps."""
    torch.manual_seed(1)
    model, tok = tiny_model("llama"), tiny_tokenizer()
    options = CaptureOptions(seq_len=64, bucket_size=8, samples_per_bucket=4, heads=None, docs=4, short_docs="concat")
    cap = capture(model, tok, _docs(), options=options, progress=False)
    metrics = analyze(cap, n_pairs=32)
    cal = qx.load_or_calibrate(tmp_path, model, tok, _docs(), cap, metrics, ks=[2, 4], docs=1, recapture=True)
    files = sorted(p.name for p in tmp_path.glob("clamp-recapture-*.nc"))
    assert len(files) == 2 and [c.attrs["clamp_calibration"].get("recaptured") is not None
                                for c in (cal[("query", 2)], cal[("query", 4)])] == [False, True]
    heads = [tuple(map(int, h)) for h in cal[("query", 4)].attrs["clamp_calibration"]["heads"]]
    chosen = {m: cal[(m, 4)] for m in ("query", "key")}
    table, profiles = qx.load_or_clamp_geometry(tmp_path, model, tok, _docs(), cap, metrics, heads, docs=1,
                                                analysis={"n_pairs": 32}, calibrated=chosen)
    separate, separate_profiles = qx.clamp_geometry(model, tok, _docs(), cap, metrics, heads, docs=1,
                                                    analysis={"n_pairs": 32}, calibrated=chosen)
    pd.testing.assert_frame_equal(table, separate, check_exact=False, rtol=1e-9)
    np.testing.assert_allclose(profiles.ap.values, separate_profiles.ap.values, rtol=1e-9)
    assert (table["residual |bias| ratio"] < 1e-3).all()
    (tmp_path / files[0]).unlink()  # a stray re-capture of other settings is refused, not used
    wrong = capture(model, tok, _docs(), options=CaptureOptions(seq_len=32, bucket_size=8, samples_per_bucket=4,
                                                                heads=None, docs=1, short_docs="concat"), progress=False)
    with pytest.raises(QkplastError, match="delete its clamp-recapture"):
        qx.clamp_geometry(model, tok, _docs(), cap, metrics, heads, docs=1, analysis={"n_pairs": 32},
                          calibrated=chosen, recaptured={"query": wrong})
