"""The settings that let the miniature learn (issue 36): their validation, the warmup-stable-decay schedule, the
copied spans, the mixed corpus and the device option rehearsed on the CPU (no model is trained here)."""

import json

import numpy as np
import pytest

from qkplast.train.config import EXECUTION_FIELDS, PRESETS, TrainConfig, TrainConfigError, corpus_parts
from qkplast.train.data import copy_batch, copy_windows, heldout_copy_windows, mixed_documents, TokenData
from qkplast.train.model import lr_at

WSD = dict(schedule="wsd", decay_share=0.2, ext_from="predecay", ext_warmup=0)


@pytest.mark.parametrize("bad, words", [
    ({"copy_share": 1.5}, "copy_share must lie in [0, 1], got 1.5"),
    ({"copy_len": 0}, "copy_len must be >= 1"),
    ({"copy_share": 0.25, "copy_len": 129}, "copy_len (129) must be at most window/2 (128)"),
    ({"decay_share": 1.0}, "decay_share must lie in (0, 1)"),
    ({"schedule": "wsd", "decay_share": 0.001}, "decay_share 0.001 of steps (240) is no step"),
    ({"schedule": "wsd", "warmup": 200}, "warmup (200) must end before the decay starts at step 192 of steps"),
    ({"ext_from": "predecay"}, "ext_from 'predecay' needs schedule 'wsd'"),
    ({"ext_from": "start"}, "ext_from"),
    ({"schedule": "linear"}, "schedule"),
    ({"device": "tpu"}, "device"),
    ({"corpus": "python-docs++stdlib-code"}, "a mix names distinct, non-empty corpora"),
    ({"corpus": "python-docs+python-docs"}, "a mix names distinct, non-empty corpora"),
])
def test_bad_new_settings_are_one_line_errors(bad, words):
    with pytest.raises(TrainConfigError) as info:
        TrainConfig.from_kwargs(**bad)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_defaults_keep_the_trained_settings_of_before():
    """The new fields' defaults are today's behaviour: no copies, a cosine, arms from the final checkpoint, the
    CPU; the stage-A checkpoints do not move."""
    c = PRESETS["default"]
    assert (c.copy_share, c.copy_len, c.schedule, c.decay_share, c.ext_from, c.device) == (
        0.0, 16, "cosine", 0.2, "final", "cpu")
    assert c.checkpoint_steps("stageA") == [0, 2, 8, 24, 76, 240] and c.ext_start == c.steps
    assert corpus_parts(c.corpus) == ["python-docs"]
    assert "device" in EXECUTION_FIELDS and "device" not in c.result_key()


def test_wsd_schedule_planted_numbers():
    peak, warm, total, m = 1.0, 10, 100, 0.1  # decay over the last 20 steps: from step 80
    lr = [lr_at(s, peak, warm, total, m, "wsd", 0.2) for s in range(total + 1)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)  # the same linear warm-up
    assert lr[10:81] == [1.0] * 71  # stable: the peak up to and including the decay's first step
    assert lr[84] == pytest.approx(0.1 + 0.9 * (1 - np.sqrt(4 / 20)))  # 1 - sqrt: 0.59751
    assert lr[90] == pytest.approx(0.1 + 0.9 * (1 - np.sqrt(0.5))) and lr[100] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(lr[80:], lr[81:]))
    # the cosine of before is untouched by the new arguments' defaults
    assert lr_at(50, 1.0, 10, 100, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 40 / 90)))


def test_predecay_start_is_a_stage_a_checkpoint():
    c = TrainConfig.from_kwargs(**WSD)
    assert c.decay_start("stageA") == 192 == c.ext_start and c.decay_start("control") == 32
    assert c.checkpoint_steps("stageA") == [0, 2, 8, 24, 76, 192, 240]
    assert TrainConfig.from_kwargs(schedule="wsd").ext_start == 240  # ext_from final: the last step


def _windows(rows=64, width=64):
    return np.arange(rows * width).reshape(rows, width) % 7 + 100  # tokens the spans never use


def test_copy_windows_writes_a_span_twice_at_a_random_distance():
    windows, L, V, eot = _windows(), 8, 50, 3
    out, first, second = copy_windows(windows, 40, L, np.random.default_rng(0), vocab_size=V, eot=eot)
    assert np.array_equal(windows, _windows())  # the input is not modified
    carry = first >= 0
    assert carry.sum() == 40 and np.array_equal(carry, second >= 0)
    assert np.array_equal(out[~carry], windows[~carry])  # the other rows are untouched
    distance = second[carry] - first[carry]
    assert distance.min() >= L and (second[carry] + L).max() <= 64 and first[carry].min() >= 0
    for row in np.flatnonzero(carry):
        span = out[row, first[row]:first[row] + L]
        assert np.array_equal(span, out[row, second[row]:second[row] + L])
        assert ((span < V) & (span != eot)).all()
        rest = np.delete(out[row], np.r_[first[row]:first[row] + L, second[row]:second[row] + L])
        assert (rest >= 100).all()  # nothing written outside the two copies
    assert len(set(distance)) > 10  # never a fixed distance


def test_copy_windows_distances_cover_their_range_and_never_the_end_of_text():
    rng, width, L = np.random.default_rng(1), 40, 8
    _, first, second = copy_windows(np.zeros((4000, width), np.int64) + 99, 4000, L, rng, vocab_size=5, eot=2)
    assert set(second - first) == set(range(L, width - L + 1))  # every distance of [copy_len, W - copy_len]
    out, _, _ = copy_windows(np.zeros((2000, width), np.int64) + 99, 2000, L, np.random.default_rng(2),
                             vocab_size=5, eot=2)
    assert set(np.unique(out)) == {0, 1, 3, 4, 99}  # uniform over the vocabulary but the end-of-text id
    with pytest.raises(ValueError, match="copy_len=21 for windows of 40 tokens"):
        copy_windows(np.zeros((2, width)), 1, 21, rng, vocab_size=5, eot=2)


def test_copy_batch_is_a_pure_function_of_seed_and_step():
    c = TrainConfig.from_kwargs(PRESETS["smoke"], copy_share=0.5, copy_len=8)
    w = _windows(8, 64)
    a = [copy_batch(c, w, seed=0, step=s, stream="stageA", eot=0) for s in range(20)]
    assert all(np.array_equal(x, copy_batch(c, w, 0, s, "stageA", 0)) for s, x in enumerate(a))
    assert not np.array_equal(a[0], copy_batch(c, w, 1, 0, "stageA", 0))  # another seed
    assert not np.array_equal(a[0], copy_batch(c, w, 0, 0, "extension", 0))  # another stream
    changed = [int((x != w).any(axis=1).sum()) for x in a]
    assert 0.3 < np.mean(changed) / 8 < 0.7 and len(set(changed)) > 1  # binomial around the share
    assert np.array_equal(copy_batch(TrainConfig(), w, 0, 0, "stageA", 0), w)  # copy_share 0: the batch as it was


def test_heldout_copy_windows_come_from_their_own_stream():
    held = _windows(6, 64)
    data = TokenData(stream=np.arange(10), chunks=held, heldout=held, heldout_stream=held, eot=0)
    w, first, second = heldout_copy_windows(data, length=32, count=10, copy_len=4, vocab_size=60)
    assert w.shape == (10, 32) and (first >= 0).all() and (second - first >= 4).all()
    again = heldout_copy_windows(data, length=32, count=10, copy_len=4, vocab_size=60)
    assert all(np.array_equal(x, y) for x, y in zip((w, first, second), again))
    assert not np.array_equal(w, heldout_copy_windows(data, 32, 10, 4, 60, seed=1)[0])


def _corpus(path, prefix, n):
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"{prefix} document {i} " * 40}) + "\n"
                            for i in range(1, n + 1)))
    return str(path)


def test_a_mixed_corpus_splits_each_part_and_keeps_the_mix_order(tmp_path):
    a, b = _corpus(tmp_path / "a.jsonl", "alpha", 10), _corpus(tmp_path / "b.jsonl", "beta", 6)
    c = TrainConfig.from_kwargs(corpus=f"{b}+{a}", heldout_every=3, max_docs=None)
    train, held, counts = mixed_documents(c)
    assert [d.id for d in held] == [f"{b}:d3", f"{b}:d6", f"{a}:d3", f"{a}:d6", f"{a}:d9"]
    assert [d.id for d in train][:4] == [f"{b}:d1", f"{b}:d2", f"{b}:d4", f"{b}:d5"]
    assert [d.id for d in train][4:] == [f"{a}:d{i}" for i in (1, 2, 4, 5, 7, 8, 10)]
    assert counts == {b: [6, 4, 2], a: [10, 7, 3]}
    assert mixed_documents(c)[0] == train  # a fixed order
    capped = mixed_documents(TrainConfig.from_kwargs(c, max_docs=6))  # max_docs counts in each corpus
    assert capped[2] == {b: [6, 4, 2], a: [6, 4, 2]}
    single = mixed_documents(TrainConfig.from_kwargs(corpus=a, heldout_every=3))
    assert [d.id for d in single[1]] == ["d3", "d6", "d9"]  # one corpus: the ids as the corpus gives them


def test_the_held_out_files_of_a_mix_carry_both_corpora(tmp_path):
    from qkplast.train.data import load_data, prepare_data

    a, b = _corpus(tmp_path / "a.jsonl", "alpha", 8), _corpus(tmp_path / "b.jsonl", "beta", 8)
    c = TrainConfig.from_kwargs(PRESETS["smoke"], corpus=f"{a}+{b}", heldout_every=4, max_docs=None, vocab_size=300,
                                window=16)
    prepare_data(c, tmp_path / "train", progress=False)
    ids = [json.loads(line)["id"] for line in (tmp_path / "train" / "data" / "heldout.jsonl").open()]
    assert ids == [f"{a}:d4", f"{a}:d8", f"{b}:d4", f"{b}:d8"]
    done = json.loads((tmp_path / "train" / "data" / "done.json").read_text())
    assert done["corpora"] == {p: {"documents": 8, "train_documents": 6, "heldout_documents": 2} for p in (a, b)}
    assert load_data(tmp_path / "train").heldout.shape == (4, 64)


def test_device_auto_resolves_to_the_cpu_without_a_gpu_and_cuda_is_refused_before_anything_is_written(tmp_path):
    import torch

    from qkplast.train import train
    from qkplast.train.model import training_device

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: auto resolves to it (rehearsed on the device machine)")
    assert training_device("auto") == "cpu" == training_device("cpu")
    with pytest.raises(TrainConfigError) as info:
        train(TrainConfig.from_kwargs(PRESETS["smoke"], device="cuda"), tmp_path / "out", progress=False)
    assert "device 'cuda' requested but torch" in str(info.value) and "sees no GPU" in str(info.value)
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


def test_a_training_begun_on_another_device_is_refused(tmp_path):
    from qkplast.train import train

    out = tmp_path / "out"
    (out / "state").mkdir(parents=True)
    (out / "state" / "seed0-stageA.json").write_text(json.dumps({"seed": 0, "arm": "stageA", "device": "cuda"}))
    with pytest.raises(TrainConfigError) as info:
        train(PRESETS["smoke"], out, progress=False)
    assert "runs trained on cuda (seed 0 stageA) and this training resolves to cpu" in str(info.value)
    assert "--device cuda" in str(info.value) and "\n" not in str(info.value)
    assert not (out / "data").exists()  # refused before the data are made
