"""Chapter 10's registration read from ``studies/miniature-readings.yaml``, the registered gate rule and the
committed full run's files: planted gate rows and a round trip, no training."""

import numpy as np
import pandas as pd
import pytest

from qkplast.train.config import PRESETS, load_train_study
from qkplast.train.evaluate import decisive_steps, load_full_run, load_readings, save_full_run, seed_readings
from qkplast.train.gates import GATES, registered_gates
from qkplast.train.run import STUDIES

FULL = load_train_study(STUDIES / "miniature-full.yaml").config


def test_the_registered_places_become_shares_events_and_windows_of_the_config():
    readings, predictions, document = load_readings(FULL)
    assert predictions == {"1": ["P1"], "2": ["P2a", "P2b"], "3": ["P3a", "P3b"], "4": ["P4a", "P4b"]}
    branch = FULL.ext_start / FULL.steps
    assert 0 < branch < 1  # the arms start before stage A's decay
    assert readings["P2a"]["from"] == ("stageA", branch, "4L") and readings["P2a"]["to"] == ("rescaled", 0.2, "4L")
    assert readings["P1"]["from"] == ("stageA", "early", "L") and readings["P1"]["to"] == ("stageA", 1.0, "L")
    # every decided contrast compares two values measured at the same window (amendment 1); only the exploratory
    # E4 reads one checkpoint at both windows, to show what the window alone does
    assert all(r["from"][2] == r["to"][2] for r in readings.values() if r["claim"] is not None)
    assert readings["E4"]["from"][2] != readings["E4"]["to"][2]
    assert {r["claim"] for r in readings.values()} == {"greater", "less", "equivalent", None}
    assert "amendment" in document and "decision_rule" in document


def test_decisive_steps_are_the_end_and_the_branch_of_stage_a_and_each_arms_end():
    assert decisive_steps(FULL) == {"stageA": [FULL.ext_start, FULL.steps],
                                    **{arm: [FULL.ext_steps] for arm in FULL.arms}}
    default = PRESETS["default"]
    assert decisive_steps(default)["stageA"] == [default.steps]  # arms from the final checkpoint: one step


def _gate_rows(fail=None):
    """Planted seed_gates rows: two seeds, stage A at steps 0, 8, 24, 32 (branch 24) and a rescaled arm at 0, 8."""
    rows = []
    for seed in (0, 1):
        for arm, steps in (("stageA", (0, 8, 24, 32)), ("rescaled", (0, 8))):
            for step in steps:
                row = {"seed": seed, "arm": arm, "step": step}
                for g in GATES:
                    applies = g in ("heldout", "in_context", "copy", "sink") or (g == "reach" and arm == "rescaled")
                    row[f"{g}_pass"] = (step > 0 or arm != "stageA") if applies else None  # early steps fail
                    row[g] = 0.0
                rows.append(row)
    table = pd.DataFrame(rows)
    if fail is not None:
        seed, arm, step, gate = fail
        table.loc[(table.seed == seed) & (table.arm == arm) & (table.step == step), f"{gate}_pass"] = False
    return table


def test_registered_gates_read_each_seed_at_its_decisive_checkpoints():
    ends = {"stageA": [24, 32], "rescaled": [8]}
    ok = registered_gates(_gate_rows(), ends)
    assert ok.passed.all()  # step 0 failed its own gates, but the seed's model learned: the point can be read
    one = registered_gates(_gate_rows(fail=(1, "stageA", 24, "copy")), ends)  # seed 1 failed at the branch
    assert not one[one.seed == 1].passed.any() and one[one.seed == 0].passed.all()
    assert set(one[one.seed == 1].failed) == {"copy"}
    arm = registered_gates(_gate_rows(fail=(0, "rescaled", 8, "reach")), ends)
    assert not arm[(arm.seed == 0) & (arm.arm == "rescaled")].passed.any()
    assert arm[(arm.seed == 0) & (arm.arm == "stageA")].passed.all()  # stage A does not read the arm's check


def _table():
    rows = []
    for seed in (0, 1, 2):
        for arm, steps in (("stageA", (0, 8, 24, 32)), ("rescaled", (0, 8))):
            for step in steps:
                for kind, window in (("L", 256), ("4L", 1024)):
                    rows.append({"seed": seed, "arm": arm, "step": step, "fraction": step / (32 if arm == "stageA" else 8),
                                 "window_kind": kind, "window": window, "train_window": 256,
                                 "metric": step + seed * 0.1 + (arm == "rescaled") * 5.0,
                                 "loss_by_position": [1.0, 0.5]})
    return pd.DataFrame(rows)


def test_a_reading_on_a_seed_that_failed_its_gates_is_not_testable_and_leaves_the_family():
    table = _table()
    spec = {"R": {"metric": "metric", "from": ("stageA", 0.75, "L"), "to": ("stageA", 1.0, "L"), "claim": "greater"}}
    gates = _gate_rows()
    gates = pd.concat([gates, gates[gates.seed == 1].assign(seed=2)])
    passed = seed_readings(table, spec, gates=registered_gates(gates, {"stageA": [24, 32], "rescaled": [8]}))
    assert passed.loc["R", "verdict"] == "supported" and np.isclose(passed.loc["R", "estimate"], 8.0)
    failed = registered_gates(gates.assign(sink_pass=gates.sink_pass.where(gates.seed != 2, False)),
                              {"stageA": [24, 32], "rescaled": [8]})
    verdict = seed_readings(table, spec, gates=failed).loc["R", "verdict"]
    assert verdict.startswith("not testable") and "sink" in verdict


def test_a_full_run_round_trips_through_its_files(tmp_path):
    table = _table()
    training = {"config": FULL.to_dict(), "runs": []}
    save_full_run(tmp_path, training, table, {"unigram": 6.0, "bigram": 4.0}, {"device": "cuda", "commit": "abc"})
    run = load_full_run(tmp_path)
    assert run["config"] == FULL and run["baseline"]["bigram"] == 4.0 and run["provenance"]["device"] == "cuda"
    pd.testing.assert_frame_equal(run["table"], table)
    (tmp_path / "checkpoints.json").unlink()
    with pytest.raises(FileNotFoundError, match="checkpoints.json is missing.*bench_miniature.py --export"):
        load_full_run(tmp_path)
