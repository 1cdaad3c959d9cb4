"""Issue 36's measurement on the session's smoke training: every checkpoint at L and at 4L, each gate's input from
one model load, measured in spawned worker processes, cached row by row (a table resumes from what was written),
and the gates read from the table (qkplast.train.evaluate, qkplast.train.gates)."""

import json

import numpy as np
import pandas as pd
import pytest

from qkplast.train import PRESETS
from qkplast.train.evaluate import MeasureSettings, checkpoint_table

SMOKE = PRESETS["smoke"]
TINY = MeasureSettings(docs=2, eval_windows=2, sink_windows=1, copy_windows=4, copy_len=8)


@pytest.fixture(scope="module")
def measured(smoke_training, tmp_path_factory):
    """Seed 0's stage A and rescaled arm measured with two workers, in a directory of links to the smoke training
    (its own geometry cache: the session's chapter-10 rehearsal caches other settings in the training's)."""
    out, training = smoke_training
    view = tmp_path_factory.mktemp("measure") / "train"
    view.mkdir()
    for name in ("data", "hf", "tokenizer", "training.json"):
        (view / name).symlink_to(out / name)
    runs = {"config": training["config"],
            "runs": [r for r in training["runs"] if r["seed"] == 0 and r["arm"] in ("stageA", "rescaled")]}
    return view, runs, checkpoint_table(view, SMOKE, runs, TINY, progress=False, workers=2)


def test_every_checkpoint_at_both_windows_with_every_gates_input(measured):
    _, runs, table = measured
    from qkplast.train.gates import sink_ratio, uniform_sink

    checkpoints = sum(len(r["branches"]) for r in runs["runs"])
    assert len(table) == 2 * checkpoints and set(table.window_kind) == {"L", "4L"}
    assert (table.groupby(["arm", "branch"]).window.apply(sorted).apply(tuple) == (64, 256)).all()
    assert table.bias_x_window.to_numpy() == pytest.approx((table.bias_strength * table.window).to_numpy())
    assert table.abs_bias_x_window.to_numpy() == pytest.approx((table.abs_bias_strength * table.window).to_numpy())
    uniform = uniform_sink(table.window.to_numpy())
    assert table.sink_ratio.to_numpy() == pytest.approx(table.sink_mass.to_numpy() / uniform)
    assert sink_ratio(table.sink_mass.iloc[0], table.window.iloc[0]) == pytest.approx(table.sink_ratio.iloc[0])
    for column in ("copy_loss", "copy_first_loss", "in_context_gain", "loss_near", "loss_half_L"):
        assert np.isfinite(table[column]).all(), column
    at_L, at_4L = table[table.window_kind == "L"], table[table.window_kind == "4L"]
    assert at_L.loss_beyond_L.isna().all() and np.isfinite(at_4L.loss_beyond_L).all()
    # a causal model reads the first 64 tokens of a 256-token window as it reads a 64-token window: the positions
    # inside L (and so the in-context gate) agree across the two windows
    pair = at_L.merge(at_4L, on="branch", suffixes=("", "_4L"))
    assert pair.in_context_gain.to_numpy() == pytest.approx(pair.in_context_gain_4L.to_numpy(), abs=1e-4)
    assert (table.device == "cpu").all()


def test_an_untrained_checkpoint_fails_the_gates_and_is_not_testable(measured):
    from qkplast.train.data import load_data
    from qkplast.train.gates import decidable, heldout_bigram_baseline, seed_gates

    view, _, table = measured
    data = load_data(view)
    baseline = heldout_bigram_baseline(data.stream, data.heldout_stream[:, : SMOKE.window], SMOKE.vocab_size)
    gates = seed_gates(table, baseline["bigram"], SMOKE.vocab_size, SMOKE.window)
    step0 = gates[(gates.arm == "stageA") & (gates.step == 0)].iloc[0]
    assert step0.heldout > 0 and step0.heldout_pass is False  # at initialisation the loss is about ln V
    assert step0["copy"] > step0.copy_threshold and not step0.passed
    status = decidable(gates).loc[("stageA", 0)].status
    assert status.startswith("not testable (gate: heldout") and "copy" in status
    assert len(gates) == table.groupby(["arm", "step"]).ngroups
    assert gates.reach_pass[gates.arm == "rescaled"].notna().all() and gates.reach_pass[gates.arm == "stageA"].isna().all()


def test_a_killed_table_resumes_from_the_rows_it_wrote(measured, monkeypatch):
    """One row's cache file removed (as if the table had been killed before it): only that row is measured again,
    in this process when workers is 1, and the table is the same."""
    import qkplast.train.evaluate as evaluate

    view, runs, table = measured
    files = sorted((view / "geometry").glob("*.json"))
    # one file a row: the rescaled arm's step 0 holds the final stage-A weights under another base, another commit
    assert len(files) == len(table)
    key = json.loads(files[0].read_text())["key"]
    assert key["settings"] == {k: v for k, v in TINY.__dict__.items() if k != "device"} and key["stage_window"] == 64
    files[0].unlink()
    calls = []
    real = evaluate.measure_checkpoint
    monkeypatch.setattr(evaluate, "measure_checkpoint", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = checkpoint_table(view, SMOKE, runs, TINY, progress=False, workers=1)
    assert len(calls) == 1 and files[0].exists()
    pd.testing.assert_frame_equal(again.drop(columns="loss_by_position"), table.drop(columns="loss_by_position"))
    # a row measured on another device is the same measurement: the device is not part of the key
    assert checkpoint_table(view, SMOKE, runs, MeasureSettings(**{**TINY.__dict__, "device": "cuda"}),
                            progress=False).shape == table.shape and len(calls) == 1
