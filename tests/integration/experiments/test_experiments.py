"""The intervention grid end to end on a tiny model: conditions, effects, readings and the clamp's geometry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkplast.experiments.grid as qx
from qkplast.analysis.metrics import analyze
from qkplast.capture.driver import capture
from qkplast.options import CaptureOptions
from tests.helpers import tiny_model, tiny_tokenizer, topic_documents


def _docs():
    return topic_documents("assert", "for", "if", "while", "try", "with")


def test_grid_end_to_end_on_a_tiny_model():
    torch.manual_seed(1)
    model, tok = tiny_model("llama"), tiny_tokenizer()
    options = CaptureOptions(seq_len=64, bucket_size=8, samples_per_bucket=4, heads=None, docs=4, short_docs="concat")
    cap = capture(model, tok, _docs(), options=options, progress=False)
    metrics = analyze(cap, n_pairs=32)
    grid = qx.run_grid(model, tok, _docs(), metrics, ks=[2], n_random=3, distances=[8, 24], windows=3, seq_len=64,
                       seg_len=6)
    assert grid.acc.dims == ("condition", "window", "distance")
    assert list(grid.kind.values) == ["none", "lowest", "random", "random", "random", "highest", "clamp query",
                                      "clamp key"]
    assert len(set(grid.heads.values[2:5])) == 3  # three distinct random draws
    ap = {(int(a), int(b)): v for a, b, v in zip(metrics.layer.values, metrics.q_head.values, metrics.ap_last20.values)}
    low = [tuple(map(int, h.split("."))) for h in str(grid.heads.values[1]).split()]
    assert max(ap[h] for h in low) <= np.nanmin([v for h, v in ap.items() if h not in low])
    eff = qx.effect_table(grid, n_boot=200)
    row = eff[(eff.kind == "lowest") & (eff.effect == "mean")].iloc[0]
    want = float((grid.acc.isel(condition=1) - grid.acc.isel(condition=0)).mean())
    assert row.estimate == pytest.approx(want) and row.lo <= row.estimate <= row.hi
    table = qx.readings(grid, n_boot=200)
    assert set(table.verdict) <= {"supported", "contradicted", "left open"} and len(table) == 5
    # re-captured on the metrics' own documents, the heads of the first clamped layer lose their bias exactly
    geometry, profiles = qx.clamp_geometry(model, tok, _docs(), cap, metrics, low, docs=4, analysis={"n_pairs": 32})
    first = geometry.layer == geometry.layer.min()
    assert (geometry["residual |bias| ratio"][first] < 0.05).all(), geometry
    assert profiles.ap.dims[:2] == ("condition", "head") and list(profiles.condition.values) == ["plain", "query", "key"]
