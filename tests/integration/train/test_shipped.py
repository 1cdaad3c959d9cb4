"""The committed full run's shipped checkpoints load and measure again on this CPU as the table says (issue 36):
``qkplast.train.shipped.recapture`` on ``data/miniature-full/``, and a ``bos`` checkpoint's measurement windows."""

import numpy as np
import pytest

from qkplast.train.evaluate import load_full_run
from qkplast.train.shipped import COMPARED, SHIPPED, TOLERANCE, measure_shipped, recapture

from tests.helpers import ROOT

FULL = ROOT / "data" / "miniature-full"


def test_the_shipped_end_of_stage_a_recaptures_within_a_twentieth_of_the_seeds_spread(tmp_path):
    full = load_full_run(FULL)
    again = recapture(full, tmp_path, only=["stageA-step1680"])
    assert len(again) == 2 * len(COMPARED) and set(again.window_kind) == {"L", "4L"}
    assert np.isfinite(again.recaptured).all() and (again.seed_sd > 0).all()
    assert TOLERANCE == 0.05 and (again.relative_to_sd <= TOLERANCE).all(), again.sort_values("relative_to_sd").tail(3)
    # not a tautology: the committed values came from the GPU's table, the recaptured ones from this CPU
    assert again.committed.to_numpy() == pytest.approx(again.recaptured.to_numpy(), rel=1e-3, abs=1e-4)
    # what lets chapter 10 keep the measurement (load_or_recapture): on the same machine it repeats bit for bit
    repeated = measure_shipped(full, tmp_path, only=["stageA-step1680"])
    assert (repeated.recaptured.to_numpy() == again.recaptured.to_numpy()).all()
    with pytest.raises(ValueError, match="stageA-step5 not shipped"):
        recapture(full, tmp_path, only=["stageA-step5"])


def test_the_archive_ships_the_decisive_and_early_checkpoints_of_seed_0():
    import tarfile

    from qkplast.train.evaluate import decisive_steps
    from qkplast.train.gates import early_checkpoint
    from qkplast.train.hub import branch_name

    full = load_full_run(FULL)
    with tarfile.open(FULL / SHIPPED) as tar:
        shipped = {name.split("/")[0] for name in tar.getnames()}
    wanted = {branch_name(arm, step) for arm, steps in decisive_steps(full["config"]).items() for step in steps}
    early = int(early_checkpoint(full["table"], full["baseline"]["unigram"])[0])
    assert shipped == wanted | {branch_name("stageA", early)}


def test_a_bos_checkpoint_is_measured_on_windows_that_start_with_the_token(smoke_training, tmp_path, monkeypatch):
    import qkplast.train.evaluate as evaluate
    from qkplast.train.data import load_data
    from qkplast.train.evaluate import MeasureSettings, measure_checkpoint
    from qkplast.train.hub import branches, hub_cache, publish, repo_id, snapshot
    from qkplast.train.tokenizer import checkpoint_tokenizer

    out, training = smoke_training
    view = tmp_path / "train"
    view.mkdir()
    for name in ("data", "tokenizer", "training.json"):
        (view / name).symlink_to(out / name)
    branch = sorted(branches(hub_cache(out), repo_id(0)))[-1]
    from transformers import LlamaForCausalLM

    LlamaForCausalLM.from_pretrained(snapshot(hub_cache(out), repo_id(0), branch)).save_pretrained(tmp_path / "ckpt")
    seen = {}
    real_profile, real_copy = evaluate.position_profile, evaluate.copy_score
    monkeypatch.setattr(evaluate, "position_profile", lambda m, w, s=None: seen.setdefault("held", w) is not None and real_profile(m, w, s))
    monkeypatch.setattr(evaluate, "copy_score", lambda m, w, *a, **k: seen.setdefault("copies", w) is not None and real_copy(m, w, *a, **k))
    eot = load_data(view).eot
    tiny = MeasureSettings(docs=2, eval_windows=2, sink_windows=1, copy_windows=4, copy_len=8)
    for bos, name in ((False, "plain"), (True, "bos")):
        checkpoint_tokenizer(out / "tokenizer", bos).save_pretrained(tmp_path / "ckpt")
        publish(tmp_path / "ckpt", hub_cache(view), repo_id(0), name)
        seen.clear()
        row = measure_checkpoint(view, 0, name, 64, tiny, stage_window=64)
        assert np.isfinite(row["sink_ratio"]) and np.isfinite(row["copy_loss"])
        for kind in ("held", "copies"):
            assert (np.asarray(seen[kind])[:, 0] == eot).all() == bos, (name, kind)
