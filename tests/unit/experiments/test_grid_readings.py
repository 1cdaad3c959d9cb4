"""Chapter 12's grid without a model: head lists as text, matched null sets, the copy design, and the readings'
statistics and decision rule on a synthetic grid whose answers are planted."""

import numpy as np
import pytest
import xarray as xr

import qkplast.experiments.grid as qx
from qkplast.errors import QkplastError
from qkplast.experiments.behavior import BehaviorError, CopyDesign


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


def synthetic_grid(n_windows=8, n_null=20, lowest=0.5, highest=0.0, far_extra=0.3, key=-0.0001, seed=0):
    """A grid with planted effects (NLL): lowest raises NLL by ``lowest`` everywhere, highest by ``highest`` plus
    ``far_extra`` at the far distance; null sets by 0.1 +- noise; the key clamp by ``key``."""
    rng = np.random.default_rng(seed)
    design = CopyDesign()
    kinds = ["none", "lowest"] + ["null lowest"] * n_null + ["highest"] + ["null highest"] * n_null + ["clamp key",
                                                                                                        "clamp query"]
    n = len(kinds)
    base = 1.0 + 0.2 * rng.normal(size=(n_windows, 2, 2))  # [window, position, distance]
    nll = np.repeat(base[None], n, 0) + 0.01 * rng.normal(size=(n, n_windows, 2, 2))
    far = np.array([0.0, 1.0])[None, None, :]
    for i, kind in enumerate(kinds):
        if kind == "lowest":
            nll[i] += lowest
        elif kind == "highest":
            nll[i] += highest + far_extra * far
        elif kind.startswith("null"):
            nll[i] += 0.1 + 0.02 * rng.normal()
            seq0 = np.zeros((2, 2), bool)
            seq0[0, 0] = seq0[1, 1] = True  # (288, 32) and (480, 256): the cells of the first sequence
            nll[i][:, ~seq0] = np.nan
        elif kind == "clamp key":
            nll[i] = nll[0] + key
    return xr.Dataset(
        {"nll": (("condition", "window", "position", "distance"), nll), "acc": (("condition", "window", "position", "distance"), np.zeros_like(nll))},
        coords={"kind": ("condition", kinds), "k": ("condition", [0] + [16] * (n - 1)),
                "draw": ("condition", [-1] * n), "heads": ("condition", [""] * n), "window": np.arange(n_windows),
                "position": list(design.positions), "distance": list(design.distances)},
        attrs={"window_tokens": design.window, "seg_len": design.seg_len, "n_null": n_null})


def test_readings_follow_the_planted_effects_and_the_rule():
    grid = synthetic_grid()
    r = qx.readings(grid).set_index("measure")
    lowest = r.iloc[0]
    assert lowest.estimate == pytest.approx(0.4, abs=0.02)  # 0.5 over the null's 0.1
    assert lowest.p == pytest.approx(1 / 21) and lowest["p floor"] == pytest.approx(1 / 21)
    # with 20 null sets the rank p cannot survive Holm across four readings: left open, however large the effect
    assert lowest["p (Holm)"] > 0.05 and lowest.verdict == "left open"
    selective = r.iloc[2]
    assert selective.estimate == pytest.approx(0.3, abs=0.02) and selective.verdict == "supported"
    key = r.iloc[3]
    assert key.verdict == "no effect"  # a tight null inside the margin stated in advance
    # 100 null sets: the rank p can pass the correction
    wide = qx.readings(synthetic_grid(n_null=100)).iloc[0]
    assert wide["p (Holm)"] < 0.05 and wide.verdict == "supported"


def test_null_position_ranks_the_targeted_set_among_its_nulls():
    grid = synthetic_grid(highest=0.05, far_extra=0.0)
    pos = qx.null_position(grid, "highest", 16)
    assert pos["n_null"] == 20 and pos["target"] < np.median(pos["null"])  # 0.05 below the null sets' 0.1
    assert pos["p"] > 0.5
    table = qx.effect_table(grid)
    assert set(table.kind) == {"lowest", "highest", "clamp key", "clamp query"} and len(table) == 16
    row = table[(table.kind == "lowest") & (table.position == 288) & (table.distance == 32)].iloc[0]
    assert row.lo <= row.effect <= row.hi and row.effect == pytest.approx(0.5, abs=0.02)


def test_targeted_sets_meet_their_nulls_on_the_windows_the_nulls_measured():
    # null sets measured on the first 3 of 8 windows (run_grid's null_windows); the lowest set's effect is planted
    # 0.5 there and 5.0 on the other windows, which the comparison with the nulls must not read
    grid = synthetic_grid()
    is_null = np.char.startswith(grid.kind.values.astype(str), "null")
    nll = grid.nll.values.copy()
    nll[is_null, 3:] = np.nan
    nll[list(grid.kind.values).index("lowest"), 3:] += 4.5
    part = grid.copy(data={"nll": nll, "acc": grid.acc.values})
    pos = qx.null_position(part, "lowest", 16)
    assert len(pos["per_window"]) == 3 and np.isfinite(pos["null"]).all()
    assert pos["target"] == pytest.approx(0.5, abs=0.02)  # over the unablated model, on windows 0-2 only
    r = qx.readings(part).set_index("measure").iloc[0]
    assert r.estimate == pytest.approx(0.4, abs=0.02)  # 0.5 over the nulls' 0.1, not pulled up by windows 3-7
    full = qx.readings(grid).set_index("measure").iloc[0]
    assert r.hi - r.lo > full.hi - full.lo  # fewer windows: a wider interval (t with 2 degrees of freedom, not 7)
    # the other readings keep every window: the key clamp's interval is the full grid's
    assert qx.readings(part).iloc[3][["lo", "hi"]].tolist() == qx.readings(grid).iloc[3][["lo", "hi"]].tolist()
