"""Chapter 12's grid without a model: head lists as text, matched null sets, the registered design and the copy
design, the geometry plan (its readings: tests/unit/stats/test_intervention_readings.py)."""

import numpy as np
import pytest
import xarray as xr

import qkplast.experiments.head_interventions as qx
from qkplast.errors import QkplastError
from qkplast.experiments.behavior import BehaviorError, CopyDesign
from qkplast.stats.intervention_readings import load_readings

REG = load_readings()


def test_heads_round_trip_through_text_and_bad_items_are_named():
    heads = [(0, 3), (12, 5), (2, 0)]
    assert qx.parse_heads(qx.format_heads(heads)) == heads
    assert qx.parse_heads("") == []
    with pytest.raises(QkplastError, match="'3-5'"):
        qx.parse_heads("1.2 3-5")


def test_null_sets_have_the_size_and_layer_mix_of_the_targeted_set():
    layer = np.repeat(np.arange(4), 9)
    metrics = xr.Dataset(coords={"layer": ("head", layer), "q_head": ("head", np.tile(np.arange(9), 4))})
    target = [(0, 1), (0, 2), (0, 7), (2, 4)]
    sets = qx.matched_random_heads(metrics, target, 30, seed=[1, 2])
    assert len(sets) == 30 and len({tuple(s) for s in sets}) > 20  # distinct draws
    for s in sets:
        assert sorted(la for la, _ in s) == [0, 0, 0, 2] and len(set(s)) == 4
    assert qx.matched_random_heads(metrics, target, 3, seed=[1, 2]) == sets[:3]  # seeded per set


def test_registration_file_holds_every_rule_the_chapter_reads():
    assert list(REG["readings"]) == ["lowest", "highest", "selective", "clamp key", "clamp plasticity"]
    for field in ("decision_rule", "gate", "working_fraction", "k_rule", "k_candidates", "n_pilot_sets", "ablation",
                  "design", "alpha"):
        assert field in REG
    d = REG["design"]
    CopyDesign(window=d["window"], seg_len=d["seg_len"], positions=tuple(d["positions"]),
               distances=tuple(d["distances"]), matched_context=d["matched_context"])  # the registered cells fit


def test_copy_design_layout_and_refusals():
    d = CopyDesign()
    assert d.sequences() == [[(288, 32), (480, 256)], [(288, 256), (480, 32)]]
    assert sorted(d.cells) == sorted((p, dd) for seq in d.sequences() for p, dd in seq)  # every cell once
    with pytest.raises(BehaviorError, match="outside"):
        CopyDesign(positions=(256, 480), distances=(48, 256))
    with pytest.raises(BehaviorError, match="overlap"):
        CopyDesign(window=96, seg_len=6, positions=(36, 56), distances=(8, 30))
    with pytest.raises(BehaviorError, match="at least as many distances"):
        CopyDesign(positions=(100, 200, 300), distances=(16, 32))


def test_geometry_plan_scales_the_windows_to_the_sampling():
    assert qx.geometry_plan(8, 4) == (4, 1, 3)
    assert qx.geometry_plan(1, 4) == (8, 4, 4)  # one query per bucket and window: 4 windows for each group
    with pytest.raises(QkplastError, match="at least 2 windows"):
        qx.geometry_plan(8, 1)
