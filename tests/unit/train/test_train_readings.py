"""The verdicts of chapter 10 from seeds: planted contrasts decided by qkplast.train.evaluate.seed_readings."""

import numpy as np
import pandas as pd
import pytest

from qkplast.train.evaluate import READING_COLUMNS, locate, seed_readings


def planted_table(effects: dict[str, np.ndarray], seeds: int = 4) -> pd.DataFrame:
    """Stage A at 10% and 100% (value 0 at 10%), one metric per planted effect: value at 100% = effect[seed]."""
    rows = []
    for seed in range(seeds):
        for fraction in (0.1, 0.95, 1.0):
            row = {"seed": seed, "arm": "stageA", "fraction": fraction, "window_kind": "own"}
            row.update({m: (v[seed] if fraction == 1.0 else 0.0) for m, v in effects.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def reading(metric, claim, margin=None):
    return {"metric": metric, "from": ("stageA", 0.1, "own"), "to": ("stageA", 1.0, "own"), "claim": claim,
            "margin": margin}


def test_locate_takes_the_nearest_share_of_the_stage():
    table = planted_table({"x": np.arange(4.0)})
    assert locate(table, "stageA", 0.9).fraction.unique().tolist() == [0.95]
    with pytest.raises(KeyError, match="rescaled"):
        locate(table, "rescaled", 0.2)


def test_planted_contrasts_get_their_verdicts():
    effects = {"up": np.array([1.0, 1.1, 0.9, 1.05]), "down": -np.array([1.0, 1.1, 0.9, 1.05]),
               "noise": np.array([1.0, -1.2, 0.8, -0.9]), "flat": np.array([0.01, -0.01, 0.02, -0.015])}
    out = seed_readings(planted_table(effects), {
        "grows": reading("up", "greater"), "shrinks": reading("down", "less"), "wrong way": reading("down", "greater"),
        "noisy": reading("noise", "greater"), "same": reading("flat", "equivalent", 0.1),
        "not same": reading("up", "equivalent", 0.1), "look": reading("up", None)})
    assert list(out.columns) == READING_COLUMNS
    assert out.verdict.to_dict() == {"grows": "supported", "shrinks": "supported", "wrong way": "contradicted",
                                     "noisy": "left open", "same": "supported", "not same": "contradicted", "look": ""}
    assert out.loc["grows", "estimate"] == pytest.approx(1.0125) and out.loc["grows", "seeds"] == 4
    # Holm across the four directional readings only; the equivalence and exploratory ones stay out of it
    directional = ["grows", "shrinks", "wrong way", "noisy"]
    assert out.loc[directional, "p_holm"].notna().all() and out.loc[["same", "look"], "p_holm"].isna().all()
    assert (out.loc[directional, "p_holm"] >= out.loc[directional, "p"]).all()


def test_interval_is_students_t_over_the_seeds_contrasts_by_hand():
    """The interval is the t interval of the per-seed contrasts (its coverage at 3-5 units: tests/test_verdict.py)."""
    from scipy import stats

    values = np.array([0.31, 0.12, 0.45])
    out = seed_readings(planted_table({"m": values}, seeds=3), {"r": reading("m", "greater")}).loc["r"]
    half = stats.t.ppf(0.975, 2) * values.std(ddof=1) / np.sqrt(3)
    assert (out.lo, out.hi) == pytest.approx((values.mean() - half, values.mean() + half))
    assert out.p == pytest.approx(2 * stats.t.sf(values.mean() / (values.std(ddof=1) / np.sqrt(3)), 2))


# --------------------------------------------------------------------------- issue 36: windows, gates, events, power

def stage_table(values: dict[int, dict[int, float]], kind: str = "L") -> pd.DataFrame:
    """Stage A rows ``{seed: {step: value of m}}`` at one window kind (fraction = step / 100)."""
    return pd.DataFrame([{"seed": seed, "arm": "stageA", "step": step, "fraction": step / 100, "window_kind": kind,
                          "m": v, "n": -v} for seed, steps in values.items() for step, v in steps.items()])


def gate_rows(table: pd.DataFrame, fail: dict | None = None) -> pd.DataFrame:
    """Rows as :func:`qkplast.train.gates.seed_gates` gives them, every gate passed but ``fail``:
    ``{(seed, step): [gate, ...]}``."""
    from qkplast.train.gates import GATES

    rows = []
    for (seed, arm, step), _ in table.groupby(["seed", "arm", "step"]):
        failed = (fail or {}).get((seed, step), [])
        row = {"seed": seed, "arm": arm, "step": step, "passed": not failed, "failed": ", ".join(failed)}
        row.update({f"{g}_pass": (g not in failed) if g in ("heldout", "in_context", "copy", "sink") else None
                    for g in GATES})
        rows.append(row)
    return pd.DataFrame(rows)


def test_checkpoint_rows_measure_every_arm_at_both_windows_and_locate_maps_the_old_names():
    from qkplast.train import PRESETS
    from qkplast.train.evaluate import checkpoint_rows, window_kinds

    config = PRESETS["smoke"]
    training = {"runs": [{"seed": 0, "arm": arm, "rope_theta": config.theta_of(arm),
                          "branches": {f"{arm}-step{s}": s for s in config.checkpoint_steps(arm)}}
                         for arm in ("stageA", *config.arms)]}
    rows = checkpoint_rows(config, training)
    assert window_kinds(config) == {"L": 64, "4L": 256}
    assert set(rows.groupby(["arm", "branch"]).window_kind.apply(tuple)) == {("L", "4L")}
    assert (rows.train_window == rows.arm.map(config.window_of)).all()
    table = rows.assign(m=rows.window)
    # "own": the window each arm trained at; "ext": the extension window
    at = lambda arm, kind: locate(table, arm, 1.0, kind).m.tolist()  # noqa: E731
    assert at("stageA", "own") == [64] and at("stageA", "ext") == [256]
    assert at("rescaled", "own") == [256] and at("rescaled", "L") == [64] and at("control", "4L") == [256]
    assert locate(table, "rescaled-short", 1.0, "own").m.tolist() == [64]


def test_a_reading_on_a_checkpoint_that_failed_a_gate_is_not_testable_and_leaves_the_holm_family():
    from qkplast.stats.decision import holm

    table = stage_table({0: {10: 0.0, 95: 0.9, 100: 1.0}, 1: {10: 0.0, 95: 1.2, 100: 1.1},
                         2: {10: 0.0, 95: 1.0, 100: 0.9}, 3: {10: 0.0, 95: 0.8, 100: 1.05}})
    gates = gate_rows(table, fail={(2, 100): ["copy", "sink"]})
    place = lambda f: ("stageA", f, "L")  # noqa: E731
    readings = {"late": {"metric": "m", "from": place(0.1), "to": place(1.0), "claim": "greater"},
                "mid": {"metric": "m", "from": place(0.1), "to": place(0.95), "claim": "greater"},
                "mid down": {"metric": "n", "from": place(0.1), "to": place(0.95), "claim": "less"},
                "look": {"metric": "m", "from": place(0.95), "to": place(1.0), "claim": None}}
    out = seed_readings(table, readings, gates=gates)
    assert out.loc["late", "verdict"] == "not testable (gate: copy, sink)" == out.loc["look", "verdict"]
    assert np.isnan(out.loc["late", "p_holm"]) and np.isfinite(out.loc["late", "estimate"])  # shown, not decided
    # the family is the two testable directional readings only
    assert out.loc[["mid", "mid down"], "p_holm"].tolist() == pytest.approx(holm(out.loc[["mid", "mid down"], "p"]))
    assert out.loc[["mid", "mid down"], "verdict"].tolist() == ["supported", "supported"]
    assert "not testable" not in out.loc["mid", "verdict"] and "left open" not in out.verdict.tolist()
    # without gates the same reading is decided as before
    assert seed_readings(table, readings).loc["late", "verdict"] == "supported"
    # a checkpoint with no gate row cannot pass
    ungated = seed_readings(table, readings, gates=gates[gates.step != 95])
    assert ungated.loc["mid", "verdict"] == "not testable (gate: ungated)"


def test_a_place_can_be_an_event_each_seed_at_its_own_step():
    table = stage_table({0: {0: 0.0, 10: 0.5, 30: 1.0, 100: 2.0}, 1: {0: 0.0, 10: 0.4, 30: 1.4, 100: 2.1},
                         2: {0: 0.0, 10: 0.6, 30: 1.1, 100: 1.9}})
    early = pd.Series({0: 10.0, 1: 30.0, 2: 10.0})
    located = locate(table, "stageA", "early", "L", events={"early": early})
    assert located.step.to_dict() == {0: 10, 1: 30, 2: 10}
    reading = {"r": {"metric": "m", "from": ("stageA", "early", "L"), "to": ("stageA", 1.0, "L"), "claim": "greater"}}
    out = seed_readings(table, reading, events={"early": early})
    assert out.loc["r", "from"] == "stageA@early (L)" and out.loc["r", "to"] == "stageA@100% (L)"
    assert out.loc["r", "estimate"] == pytest.approx(np.mean([2.0 - 0.5, 2.1 - 1.4, 1.9 - 0.6]))
    # a seed that never had the event: the reading is not testable
    missing = seed_readings(table, reading, events={"early": early.where(early.index != 1)})
    assert missing.loc["r", "verdict"] == "not testable (gate: early)"
    with pytest.raises(KeyError, match="event 'early' is not defined"):
        seed_readings(table, reading)


def test_the_smallest_detectable_effect_is_reported_at_each_readings_holm_level():
    from qkplast.stats.power import detectable_effect

    rng = np.random.default_rng(0)
    effects = {f"m{i}": rng.normal(mu, 0.5, 5) for i, mu in enumerate((2.0, 0.8, 0.1))}
    out = seed_readings(planted_table(effects, seeds=5), {k: reading(k, "greater") for k in effects}
                        | {"eq": reading("m0", "equivalent", 5.0)})
    order = out.loc[list(effects)].sort_values("p").index  # smallest p first: tested at 0.05/3, then 0.05/2, 0.05
    assert out.loc[order, "holm_level"].tolist() == pytest.approx([0.05 / 3, 0.05 / 2, 0.05])
    for name in effects:
        sd = effects[name].std(ddof=1)
        assert out.loc[name, "detectable"] == pytest.approx(detectable_effect(5, out.loc[name, "holm_level"]) * sd)
    assert np.isnan(out.loc["eq", "detectable"]) and np.isnan(out.loc["eq", "holm_level"])  # not in the family
