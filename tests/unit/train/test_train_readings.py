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
