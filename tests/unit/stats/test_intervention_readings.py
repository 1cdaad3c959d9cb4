"""Chapter 12's readings without a model (qkplast.stats.intervention_readings): the registration, the readings'
statistics and decision rule on a synthetic grid whose answers are planted, the functional check's gate and the k rule."""

import numpy as np
import pytest
import xarray as xr

import qkplast.stats.intervention_readings as qs
from qkplast.errors import QkplastError
from qkplast.experiments.behavior import CopyDesign

REG = qs.load_readings()


def test_a_reading_without_its_fields_is_refused(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("readings:\n  lowest: {text: t, statistic: s, target: lowest, claim: greater}\n")
    with pytest.raises(QkplastError, match="'lowest'.*null_sets"):
        qs.load_readings(bad)


def synthetic_grid(n_windows=8, n_null=20, lowest=0.5, highest=0.0, far_extra=0.3, null_far_extra=0.0, key=-0.0001,
                   null_windows=None, base_nll=1.0, broken=(), seed=0):
    """A grid with planted effects (NLL): lowest raises NLL by ``lowest`` everywhere, highest by ``highest`` plus
    ``far_extra`` at the far distance; null ablation sets by 0.1 +- noise (plus ``null_far_extra`` at the far
    distance); null clamp sets by 0 +- noise, the key clamp by ``key``; kinds in ``broken`` by 20 nats. Null sets
    measure every cell of the first ``null_windows`` windows (None: all)."""
    rng = np.random.default_rng(seed)
    design = CopyDesign()
    kinds = (["none", "lowest"] + ["null lowest"] * n_null + ["highest"] + ["null highest"] * n_null
             + ["clamp key", "clamp query"] + ["null clamp key"] * n_null)
    n = len(kinds)
    base = base_nll + 0.2 * rng.normal(size=(n_windows, 2, 2))  # [window, position, distance]
    nll = np.repeat(base[None], n, 0) + 0.01 * rng.normal(size=(n, n_windows, 2, 2))
    far = np.array([0.0, 1.0])[None, None, :]
    for i, kind in enumerate(kinds):
        if kind == "lowest":
            nll[i] += lowest
        elif kind == "highest":
            nll[i] += highest + far_extra * far
        elif kind in ("null lowest", "null highest"):
            nll[i] += 0.1 + 0.02 * rng.normal() + null_far_extra * far
        elif kind == "null clamp key":
            nll[i] += 0.002 * rng.normal()
        elif kind == "clamp key":
            nll[i] = nll[0] + key
        if kind in broken:
            nll[i] += 20.0
        if kind.startswith("null") and null_windows is not None:
            nll[i][null_windows:] = np.nan
    return xr.Dataset(
        {"nll": (("condition", "window", "position", "distance"), nll),
         "acc": (("condition", "window", "position", "distance"), np.zeros_like(nll))},
        coords={"kind": ("condition", kinds), "k": ("condition", [0] + [16] * (n - 1)),
                "draw": ("condition", [-1] * n), "heads": ("condition", [""] * n), "window": np.arange(n_windows),
                "position": list(design.positions), "distance": list(design.distances)},
        attrs={"window_tokens": design.window, "seg_len": design.seg_len, "n_null": n_null, "vocab": 49152})


def test_readings_follow_the_planted_effects_and_the_rule():
    r = qs.readings(synthetic_grid(), REG).set_index("key")
    assert list(r.index) == ["lowest", "highest", "selective", "clamp key"]  # no plasticity given: left out
    assert r.attrs["m"] == 4 and r.gate.isna().all()
    assert r.loc["lowest"].estimate == pytest.approx(0.4, abs=0.02)  # 0.5 over the nulls' 0.1
    # the rank p sits at its floor and could not pass Holm across four readings; the parametric tail can
    assert r.loc["lowest", "p rank"] == pytest.approx(1 / 21) == r.loc["lowest", "p floor"]
    assert r.loc["lowest", "p (Holm)"] < 0.05 and r.loc["lowest"].verdict == "supported"
    # the highest set's far-minus-near contrast (0.3) against the null sets' (0): supported
    assert r.loc["selective"].estimate == pytest.approx(0.3, abs=0.02) and r.loc["selective"].verdict == "supported"
    # a key clamp no different from its null clamps, tightly: no effect (inside the registered margin)
    assert r.loc["clamp key"].verdict == "no effect"
    assert (r.detectable > 0).all() and (r.lo < r.estimate).all() and (r.estimate < r.hi).all()


def test_the_distance_contrast_is_read_against_the_nulls_distance_contrast():
    # the null sets show the same far-minus-near rise as the highest set: the distance effect is not the heads'
    same = qs.readings(synthetic_grid(far_extra=0.3, null_far_extra=0.3), REG).set_index("key").loc["selective"]
    assert abs(same.estimate) < 0.03 and same.verdict != "supported"
    # the highest set without any distance effect, the null sets with one: contradicted
    less = qs.readings(synthetic_grid(far_extra=0.0, null_far_extra=0.3), REG).set_index("key").loc["selective"]
    assert less.estimate == pytest.approx(-0.3, abs=0.03) and less.verdict == "contradicted"


def test_a_broken_condition_gates_its_readings_out_of_the_family():
    grid = synthetic_grid(broken=("highest",))
    check = qs.functional_check(grid, REG["working_fraction"])
    assert check.attrs["threshold"] == pytest.approx(0.5 * np.log(49152))
    assert list(check.kind[~check.working]) == ["highest"]
    r = qs.readings(grid, REG).set_index("key")
    for key in ("highest", "selective"):
        assert r.loc[key].verdict == "not testable (gate: model broken)" and np.isnan(r.loc[key].p)
    assert r.attrs["m"] == 2 and r.loc["lowest"].verdict == "supported"  # the family holds the other two
    # the median null set broken gates too, whatever the targeted set does
    r = qs.readings(synthetic_grid(broken=("null lowest",)), REG).set_index("key")
    assert r.loc["lowest"].verdict.startswith("not testable")
    # a k pilot whose median set at 16 is broken chooses 8
    pilot = xr.Dataset({"nll": (("k", "set"), [[1.0, 1.2, 9.0], [2.0, 3.0, 8.0], [4.0, 6.0, 7.0]])},
                       coords={"k": [4, 8, 16]}, attrs={"threshold": 5.4})
    assert qs.choose_k(pilot) == 8
    assert qs.choose_k(pilot.assign(nll=pilot.nll + 10)) == 4  # none works: the smallest, and the gates say so


def test_plasticity_reading_against_its_null_clamps():
    grid = synthetic_grid()
    null = np.random.default_rng(3).normal(0.01, 0.005, 20)
    r = qs.readings(grid, REG, plasticity={"target": 0.08, "null": null}).set_index("key")
    assert r.attrs["m"] == 5 and r.loc["clamp plasticity"].verdict == "supported"
    r = qs.readings(grid, REG, plasticity={"target": 0.012, "null": null}).set_index("key")
    assert r.loc["clamp plasticity"].verdict == "left open"


def test_null_position_ranks_the_targeted_set_among_its_nulls():
    grid = synthetic_grid(highest=0.05, far_extra=0.0)
    pos = qs.null_position(grid, "highest", 16)
    assert pos["n_null"] == 20 and pos["target"] < np.median(pos["null"])  # 0.05 below the null sets' 0.1
    assert pos["p"] > 0.5
    table = qs.effect_table(grid)
    assert set(table.kind) == {"lowest", "highest", "clamp key", "clamp query"} and len(table) == 16
    row = table[(table.kind == "lowest") & (table.position == 288) & (table.distance == 32)].iloc[0]
    assert row.lo <= row.effect <= row.hi and row.effect == pytest.approx(0.5, abs=0.02)


def test_targeted_sets_meet_their_nulls_on_the_windows_the_nulls_measured():
    # null sets measured on the first 3 of 8 windows; the lowest set's effect is planted 0.5 there and 5.0 on the
    # other windows, which the comparison with the nulls must not read
    grid = synthetic_grid(null_windows=3)
    nll = grid.nll.values.copy()
    nll[list(grid.kind.values).index("lowest"), 3:] += 4.5
    part = grid.copy(data={"nll": nll, "acc": grid.acc.values})
    pos = qs.null_position(part, "lowest", 16)
    assert len(pos["per_window"]) == 3 and np.isfinite(pos["null"]).all()
    assert pos["target"] == pytest.approx(0.5, abs=0.02)  # over the unablated model, on windows 0-2 only
    r = qs.readings(part, REG).set_index("key").loc["lowest"]
    assert r.estimate == pytest.approx(0.4, abs=0.02)  # 0.5 over the nulls' 0.1, not pulled up by windows 3-7
