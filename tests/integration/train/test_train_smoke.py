"""The smoke training end to end: training.json, same-seed determinism, the hub branches read offline through
qkplast's own model loading, a model that learned more than unigram statistics, and the checkpoint measurements.
The training is the session's (``smoke_training`` in tests/conftest.py), shared with the acceptance tier's."""

import json
import os

import numpy as np
import pytest

from qkplast.train import PRESETS, TrainConfig, hub_cache, repo_id, train
from qkplast.train.hub import snapshot

from tests.helpers import ROOT, smoke_branch_names, smoke_refs

SMOKE = PRESETS["smoke"]
FINAL, MID = smoke_branch_names()


@pytest.fixture(scope="module")
def smoke(smoke_training):
    return smoke_training


def test_training_json_has_the_issue_schema(smoke):
    out, training = smoke
    on_disk = json.loads((out / "training.json").read_text())
    assert on_disk == training and set(on_disk) == {"config", "device", "gpu", "runs"}
    assert TrainConfig.from_kwargs(**on_disk["config"]) == SMOKE
    assert [(r["seed"], r["arm"]) for r in on_disk["runs"]] == [
        (s, a) for s in range(SMOKE.seeds) for a in ("stageA", "rescaled", "control", "rescaled-short")]
    for run in on_disk["runs"]:
        assert set(run) == {"seed", "arm", "rope_theta", "branches", "steps", "device", "gpu", "cpu_capability",
                            "mkl_cbwr", "wall_s", "tokens_per_s"}
        assert (run["device"], run["gpu"], run["cpu_capability"]) == ("cpu", None, "DEFAULT") and run["wall_s"] > 0
        assert run["rope_theta"] == SMOKE.theta_of(run["arm"])
        prefix = "stageA" if run["arm"] == "stageA" else f"ext-{run['arm']}"
        assert run["branches"] == {f"{prefix}-step{n}": n for n in SMOKE.checkpoint_steps(run["arm"])}
        assert [s["step"] for s in run["steps"]] == list(range(1, SMOKE.steps_of(run["arm"]) + 1))
        assert all(set(s) == {"step", "loss", "tokens_per_s"} and np.isfinite(s["loss"]) and s["tokens_per_s"] > 0
                   for s in run["steps"])
        assert set(run["branches"]) <= set(smoke_refs(out, run["seed"]))
    assert not list((out / "state").glob("*.pt"))  # resume states are removed once a run is finished


def test_same_seed_gives_identical_weights(smoke, tmp_path):
    """A second training of seed 0 (alone: the number of seeds does not enter a seed's run) writes the same commits."""
    out, _ = smoke
    again = tmp_path / "again"
    train(TrainConfig.from_kwargs(SMOKE, seeds=1), again, progress=False)
    assert smoke_refs(again, 0) == smoke_refs(out, 0) and len(smoke_refs(out, 0)) == 4 + 3 * 3
    assert smoke_refs(out, 1) != smoke_refs(out, 0)  # and another seed does not
    # the commit is a digest of the files: equal commits are equal weights, byte for byte
    a, b = snapshot(hub_cache(out), repo_id(0), FINAL), snapshot(hub_cache(again), repo_id(0), FINAL)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_the_control_arm_starts_from_the_final_stage_a_weights(smoke):
    out, _ = smoke
    assert smoke_refs(out, 0)["ext-control-step0"] == smoke_refs(out, 0)[FINAL]  # same files: same commit
    resc, final = (snapshot(hub_cache(out), repo_id(0), b) for b in ("ext-rescaled-step0", FINAL))
    assert (resc / "model.safetensors").read_bytes() == (final / "model.safetensors").read_bytes()
    assert json.loads((resc / "config.json").read_text())["rope_parameters"]["rope_theta"] == 10 * SMOKE.rope_theta


def test_branches_resolve_offline_through_qkplast_loading(smoke, monkeypatch):
    from huggingface_hub import constants

    from qkplast.capture.models import load_model

    out, _ = smoke
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache(out)))
    for branch, theta in ((MID, 1000.0), ("ext-rescaled-step8", 10000.0)):
        loaded = load_model(f"{repo_id(0)}@{branch}", device="cpu", local_files_only=True)
        assert loaded.info["commit"] == smoke_refs(out, 0)[branch] and loaded.info["revision"] == branch
        assert loaded.model.config.rope_parameters["rope_theta"] == theta
        assert type(loaded.model).__name__ == "LlamaForCausalLM" and loaded.model.config.num_key_value_heads == 1
        assert loaded.tokenizer.decode(loaded.tokenizer("def f(x): return x")["input_ids"]) == "def f(x): return x"
    from qkplast.capture.models import ModelError

    with pytest.raises(ModelError, match="stageA-step7.*cached revisions: ext-control-step0"):
        load_model(f"{repo_id(0)}@stageA-step7", device="cpu", local_files_only=True)


def test_the_smoke_model_beats_the_unigram_entropy(smoke):
    from qkplast.capture.models import load_model
    from qkplast.train.data import load_data, ngram_baselines
    from qkplast.train.evaluate import position_profile

    out, training = smoke
    entropies = ngram_baselines(load_data(out), SMOKE.vocab_size)
    held = load_data(out).heldout[:4, :SMOKE.window]
    for seed in range(SMOKE.seeds):
        final, untrained = (load_model(str(snapshot(hub_cache(out), repo_id(seed), b)), device="cpu",
                                       local_files_only=True) for b in (FINAL, "stageA-step0"))
        loss, _ = position_profile(final.model, held)
        assert loss.mean() < entropies["unigram"] - 0.1 < position_profile(untrained.model, held)[0].mean()
    # the training loss too, over the last ten steps, against the unigram entropy of the training tokens
    assert all(np.mean([s["loss"] for s in r["steps"][-10:]]) < entropies["unigram_plugin"] - 0.1
               for r in training["runs"])


def test_sink_mass_of_uniform_attention_is_the_harmonic_mean_by_hand():
    """Zero query weights make every score 0: query t spreads 1/(t+1) on each key, so on token 0 too."""
    import torch

    from qkplast.train.model import build_model
    from qkplast.train.evaluate import position_profile

    model = build_model(SMOKE, "stageA", eot=0, seed=0).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.zero_()
    L = 48
    _, sink = position_profile(model, np.arange(2 * L).reshape(2, L) % SMOKE.vocab_size)
    assert sink == pytest.approx(np.mean(1 / np.arange(2, L + 1)), rel=1e-6)
    assert model.config._attn_implementation == "sdpa"  # restored after the eager pass


def test_measure_one_checkpoint(smoke):
    from qkplast.train.evaluate import MeasureSettings, measure_checkpoint, position_bins

    out, _ = smoke
    row = measure_checkpoint(out, 1, "ext-rescaled-step8", SMOKE.ext_window, MeasureSettings(docs=2, eval_windows=2))
    assert row["commit"] == smoke_refs(out, 1)["ext-rescaled-step8"] and row["heads"] == SMOKE.layers * SMOKE.heads
    assert len(row["loss_by_position"]) == len(position_bins(SMOKE.ext_window)) - 1 and 0 < row["sink_mass"] < 1
    assert all(np.isfinite(v) for k, v in row.items() if isinstance(v, float))
    terms = ("ap_drop_baseline", "ap_drop_bias", "ap_drop_content", "ap_drop_interaction")  # they add up to ap_drop
    assert row["ap_drop"] == pytest.approx(sum(row[t] for t in terms))


def _env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
            "PYTHONPATH": str(ROOT)}


