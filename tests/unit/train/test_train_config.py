"""TrainConfig, its presets and study files, the schedules and the pure data helpers of qkplast.train (no model)."""

import json

import numpy as np
import pytest

from qkplast.train.config import (ARMS, PRESETS, TrainConfig, TrainConfigError, load_train_study, log_spaced,
                                  theta_bound)
from qkplast.train.data import TokenData, batch_windows, ngram_baselines, split_documents
from qkplast.train.model import lr_at, parameter_count


def test_round_trip_and_presets():
    for config in PRESETS.values():
        assert TrainConfig.from_kwargs(**json.loads(json.dumps(config.to_dict()))) == config
    assert PRESETS["default"] == TrainConfig()
    assert PRESETS["default"].arms == ARMS and PRESETS["default"].seeds >= 3


@pytest.mark.parametrize("bad, words", [
    ({"steps": 0}, "steps must be >= 1"),
    ({"heads": 4, "kv_heads": 3}, "multiple of kv_heads"),
    ({"head_dim": 31}, "head_dim must be even"),
    ({"batch": 6}, "multiple of ext_factor"),
    ({"arms": ("rescaled", "sideways")}, "arms must be distinct names"),
    ({"warmup": 500}, "warmup (500) must be >= 0 and shorter than steps"),
    ({"first_checkpoint": 0}, "first_checkpoint must lie in (0, 1]"),
    ({"lr": -1}, "lr must be a positive number"),
    ({"steps": "many"}, "expects int"),
    ({"vocab_size": 100}, "vocab_size must be >= 300"),
])
def test_bad_settings_are_one_line_errors(bad, words):
    with pytest.raises(TrainConfigError) as info:
        TrainConfig.from_kwargs(**bad)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_unknown_setting_names_the_valid_ones():
    with pytest.raises(TrainConfigError, match="unknown training setting.*'stepz'.*ext_steps"):
        TrainConfig.from_kwargs(stepz=3)


def test_values_are_typed_from_the_annotations():
    c = TrainConfig.from_kwargs(steps="30", lr="1e-3", rope_theta=500, arms=["control"])
    assert (c.steps, c.lr, c.rope_theta, c.arms) == (30, 0.001, 500.0, ("control",))


def test_arms_windows_and_bases():
    c = TrainConfig()
    assert [c.window_of(a) for a in ("stageA", *ARMS)] == [256, 1024, 1024, 256]
    assert [c.theta_of(a) for a in ("stageA", *ARMS)] == [1000.0, 10000.0, 1000.0, 10000.0]
    # Men et al.'s bound: stage A above it; the control arm's unchanged base falls below it at 4x the window
    assert theta_bound(256) == pytest.approx(353, abs=1) and c.rope_theta > theta_bound(c.window)
    assert c.theta_of("control") < theta_bound(c.ext_window) < c.theta_of("rescaled")


def test_log_spaced_schedule_has_step_zero_the_end_and_half_decades():
    assert log_spaced(1000, 5, 0.01) == [0, 10, 32, 100, 316, 1000]
    assert log_spaced(40, 3, 0.05) == [0, 2, 9, 40]
    assert TrainConfig().checkpoint_steps("stageA") == [0, 2, 8, 24, 76, 240]
    assert log_spaced(5, 4, 0.01) == [0, 1, 5]  # rounding collisions collapse, never a step below 1


def test_learning_rate_schedule():
    peak, warm, total = 1e-3, 10, 100
    lrs = [lr_at(s, peak, warm, total, 0.1) for s in range(total)]
    assert lrs[0] == pytest.approx(peak / warm) and lrs[warm - 1] == pytest.approx(peak)
    assert lrs[warm] == pytest.approx(peak) and lr_at(total, peak, warm, total, 0.1) == pytest.approx(0.1 * peak)
    assert lrs[-1] == pytest.approx(0.1 * peak, rel=0.01)
    assert all(a >= b for a, b in zip(lrs[warm:], lrs[warm + 1:]))


def test_parameter_count_matches_the_formula_by_hand():
    c = TrainConfig()
    per_layer = 128 * 32 * (2 * 4 + 2 * 2) + 3 * 128 * 384 + 2 * 128  # q,o + k,v; SwiGLU; two RMSNorm gains
    assert parameter_count(c) == 4096 * 128 + 4 * per_layer + 128 == 1_311_872


def test_batches_are_a_pure_function_of_seed_and_step_and_cover_every_window_per_epoch():
    n, per = 10, 4  # 2.5 steps per epoch: batches straddle epochs
    steps = [batch_windows(n, per, s, seed=3, stream=0) for s in range(5)]
    flat = np.concatenate(steps)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert all(np.array_equal(a, batch_windows(n, per, s, seed=3, stream=0)) for s, a in enumerate(steps))
    assert not np.array_equal(flat, np.concatenate([batch_windows(n, per, s, seed=4, stream=0) for s in range(5)]))


def test_documents_split_every_nth():
    train, held = split_documents(range(1, 11), 5)
    assert held == [5, 10] and train == [1, 2, 3, 4, 6, 7, 8, 9]


def test_ngram_baselines_on_a_planted_stream():
    # a deterministic cycle 0 1 2 3 0 1 2 3 ...: unigram entropy log 4, and the next token is fixed by the last
    stream = np.tile(np.arange(4), 5000)
    held = np.tile(np.arange(4), 32)[None]
    data = TokenData(stream=stream, chunks=stream[:64].reshape(1, 64), heldout=held, heldout_stream=held, eot=0)
    b = ngram_baselines(data, vocab_size=4)
    assert b["unigram_plugin"] == pytest.approx(np.log(4), abs=1e-6)
    assert b["unigram"] == pytest.approx(np.log(4), abs=1e-3)
    assert b["bigram_plugin"] == pytest.approx(0, abs=1e-6) and b["bigram"] < 0.01


def test_study_file(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text("name: mini\nout: somewhere\npreset: smoke\ntrain: {seeds: 3, steps: 20}\n")
    study = load_train_study(path)
    assert (study.name, str(study.out), study.config.seeds, study.config.steps) == ("mini", "somewhere", 3, 20)
    assert study.config.hidden == PRESETS["smoke"].hidden
    assert load_train_study(path, overrides={"steps": 30}, preset="default").config.hidden == 128


@pytest.mark.parametrize("text, words", [
    ("name: x\ntrian: {}\n", "unknown key(s) ['trian']"),
    ("train: {}\n", "'name' must be a non-empty string"),
    ("name: x\ntrain: {stepz: 3}\n", "unknown training setting(s) ['stepz']"),
    ("name: x\ntrain: {steps: -1}\n", "steps must be >= 1"),
    ("name: x\ntrain: [1, 2]\n", "'train' must be a mapping"),
    ("name: x\npreset: huge\n", "unknown preset 'huge'"),
    ("name: [\n", "not valid YAML"),
])
def test_bad_study_files_are_one_line_errors(tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TrainConfigError) as info:
        load_train_study(path)
    assert words in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_shipped_study_files_validate():
    from qkplast.train.run import STUDIES

    preview, full = load_train_study(STUDIES / "miniature.yaml"), load_train_study(STUDIES / "miniature-full.yaml")
    assert full.config.seeds >= 5 and preview.config.seeds >= 2  # intervals over seeds need at least two
    # the preview is the full run's pipeline at a smaller budget: the same Llama, data and schedule, fewer tokens
    same = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab_size", "corpus", "window",
            "schedule", "ext_from", "copy_len", "arms", "ext_factor", "rope_theta", "theta_factor")
    assert [getattr(full.config, k) for k in same] == [getattr(preview.config, k) for k in same]
    tokens = [c.steps * c.batch * c.window for c in (full.config, preview.config)]
    assert tokens[0] > 100 * tokens[1]
    # the full run's extension: at least 20% of stage A's tokens per arm, from the pre-decay branch, no re-warming
    assert full.config.ext_steps >= 0.2 * full.config.steps and full.config.ext_warmup == 0
    assert full.config.ext_start < full.config.steps
