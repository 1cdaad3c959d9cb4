"""The ``bos`` training option (issue 36): every window starts with <|endoftext|> in training, the checkpoints'
tokenizer puts it in front of a text, and the pilots that tested it (bench_miniature's pilots on several seeds)."""

import importlib.util
import sys

import numpy as np
import pytest

from qkplast.capture.corpus import prefix_tokens
from qkplast.train import PRESETS
from qkplast.train.config import TrainConfig
from qkplast.train.data import TokenData, with_bos
from qkplast.train.loop import _batch
from qkplast.train.tokenizer import EOT, checkpoint_tokenizer, train_tokenizer

from tests.helpers import ROOT

EOT_ID = 0


def test_with_bos_puts_the_token_first_in_a_copy_and_nothing_without_it():
    windows = np.arange(12).reshape(3, 4) + 5
    started = with_bos(windows, True, EOT_ID)
    assert (started[:, 0] == EOT_ID).all() and (started[:, 1:] == windows[:, 1:]).all()
    assert windows[0, 0] == 5  # the caller's windows are left as they were (they may be a read-only map)
    assert with_bos(windows, False, EOT_ID) is windows


def _data(config: TrainConfig) -> TokenData:
    stream = np.arange(1, 20_001, dtype=np.int32) % 500 + 1  # no <|endoftext|> anywhere
    chunks = stream[: 16 * config.ext_window].reshape(16, config.ext_window)
    return TokenData(stream=stream, chunks=chunks, heldout=chunks[:2], heldout_stream=chunks[:2], eot=EOT_ID)


@pytest.mark.parametrize("bos", [True, False])
def test_every_training_window_of_every_arm_starts_with_the_token_only_with_bos(bos):
    config = TrainConfig.from_kwargs(PRESETS["smoke"], bos=bos, copy_share=0.5, vocab_size=512)
    data = _data(config)
    for arm in ("stageA", *config.arms):
        x = _batch(config, arm, data, seed=0, step=3)  # [windows, window of the arm]: stage A's tokens per step
        assert x.shape[1] == config.window_of(arm) and x.size == config.batch * config.window
        assert (x[:, 0] == EOT_ID).all() == bos, arm
        assert (x[:, 1:] != EOT_ID).all()  # the token is put first, nowhere else


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(["def f(x):\n    return x + 1\n"] * 40 + ["The quick brown fox."] * 40, 300).save_pretrained(path)
    return path


def test_a_bos_checkpoints_tokenizer_puts_the_token_in_front_and_keeps_it_when_saved(saved_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    plain = checkpoint_tokenizer(saved_tokenizer, False)
    bos = checkpoint_tokenizer(saved_tokenizer, True)
    eot = bos.convert_tokens_to_ids(EOT)
    assert prefix_tokens(plain) == [] and prefix_tokens(bos) == [eot]
    text = "def f(x): return x"
    assert bos(text)["input_ids"] == [eot, *plain(text)["input_ids"]]
    assert bos(text, add_special_tokens=False)["input_ids"] == plain(text)["input_ids"]  # the data's encoding
    bos.save_pretrained(tmp_path / "checkpoint")
    assert prefix_tokens(AutoTokenizer.from_pretrained(tmp_path / "checkpoint", local_files_only=True)) == [eot]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_miniature", ROOT / "benchmarks" / "bench_miniature.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_miniature"] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_pilots_load_with_their_seeds_and_names_select_them():
    bench = _bench()
    base = TrainConfig()
    pilots = bench.load_pilots(ROOT / "studies" / "miniature-pilots.yaml", base)
    by_name = {name: (config, seeds) for name, config, seeds in pilots}
    assert by_name["base"][1] == [0] and by_name["bos"][1] == [0, 1, 2, 3]
    assert by_name["bos"][0].bos and by_name["bos-copy-half"][0].copy_share == 0.5 and not by_name["base"][0].bos
    chosen = bench.load_pilots(ROOT / "studies" / "miniature-pilots.yaml", base, ["bos-copy-half", "bos"])
    assert [name for name, _, _ in chosen] == ["bos", "bos-copy-half"]  # the file's order
    with pytest.raises(SystemExit, match="no pilot named nope .* its pilots: base"):
        bench.load_pilots(ROOT / "studies" / "miniature-pilots.yaml", base, ["nope"])


def test_a_pilot_is_chosen_only_when_every_one_of_its_seeds_passes_every_gate():
    bench = _bench()
    config = TrainConfig()
    pilots = [("a", config, [0, 1]), ("b", config, [0, 1])]

    def result(name, seed, passed):
        return {"name": name, "seed": seed, "gates": [{"gate": "sink", "passed": True}, {"gate": "copy", "passed": passed}]}

    one_seed_fails = [result("a", 0, True), result("a", 1, False), result("b", 0, True), result("b", 1, True)]
    assert bench.choose(pilots, one_seed_fails)[::2] == ("b", True)
    none_passes = [result("a", 0, True), result("a", 1, False), result("b", 0, False), result("b", 1, True)]
    assert bench.choose(pilots, none_passes)[::2] == ("a", False)
