"""Content-decay conditions (beyond the thesis, 7.6): the interventions are exact and reversible, the reseeded
null is exactly the captures other seeds take, the intervals are paired jackknives over documents."""

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as T

from qkplast.experiments.condition_captures import (condition_grid, first_keys_mask, first_keys_masked, reseed_null,
                                            reseeded_captures, rope_base_scaled)
from qkplast.stats.condition_readings import QUANTITIES, condition_table, read_conditions
from qkplast.analysis.decompose import model_level_terms
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.theory.planted import planted_capture

COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, vocab_size=100, max_position_embeddings=256)


def tiny_llama(theta: float):
    torch.manual_seed(0)
    cfg = T.LlamaConfig(**COMMON, rope_parameters={"rope_type": "default", "rope_theta": theta})
    return T.LlamaForCausalLM(cfg).eval()


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_rope_base_scaling_is_the_model_with_a_scaled_theta_and_is_undone():
    ids = torch.randint(0, 100, (1, 48))
    a, b = tiny_llama(10000.0), tiny_llama(40000.0)
    b.load_state_dict(a.state_dict())
    before = logits(a, ids)
    assert not torch.allclose(before, logits(b, ids), atol=1e-4)  # the base matters at these lengths
    with rope_base_scaled(a, 4.0):
        torch.testing.assert_close(logits(a, ids), logits(b, ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits(a, ids), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="positive"):
        with rope_base_scaled(a, 0.0):
            pass


def test_first_keys_mask_shape_and_rows():
    m = first_keys_mask(10, 3)[0, 0]
    assert m.any(1).all()  # every row keeps a key
    assert not m[5, :3].any() and m[5, 3:6].all() and not m[5, 6:].any()
    assert m[2, :3].all()  # queries before k keep their causal keys


def test_masking_first_keys_changes_only_later_positions():
    model = tiny_llama(10000.0)
    ids = torch.randint(0, 100, (1, 40))
    before = logits(model, ids)
    with first_keys_masked(model, 4):
        masked = logits(model, ids)
    torch.testing.assert_close(masked[:, :4], before[:, :4])  # positions < k see the same keys
    assert (masked[:, 4:] - before[:, 4:]).abs().amax() > 1e-3
    torch.testing.assert_close(logits(model, ids), before, rtol=0, atol=0)  # undone on exit


def test_grid_names_and_errors():
    grid = condition_grid(1024, (0.5, 2), (1024, 2048), ("bos", "mid_document", "mask_first"), 4, 512)
    assert list(grid) == ["baseline", "all_positions", "rope_x0.5", "rope_x2", "window_2048", "bos", "mid_document",
                          "mask_first_4"]
    assert grid["all_positions"]["all_positions"] and not grid["baseline"]["all_positions"]
    assert grid["mid_document"]["start"] == 512 and grid["window_2048"]["seq_len"] == 2048
    with pytest.raises(ValueError, match="unknown sink"):
        condition_grid(1024, (), (), ("sinks",), 4, 512)


def _planted_conditions():
    """A planted 'baseline' at every position, the baseline itself cut from it, and two 'conditions'."""
    from qkplast.capture.sampling import sample_positions

    full, _ = planted_capture(n_heads=3, dim=8, seq_len=512, bucket_size=32, n_docs=5, samples_per_bucket=32, seed=5)
    full.attrs.update(samples_per_bucket=4, seed=0)  # every position; a capture would keep 4 per bucket with seed 0
    keep = np.zeros(full.sizes["sample"], dtype=bool)
    for d in np.unique(full.doc.values):
        keep |= (full.doc.values == d) & np.isin(full.position.values, sample_positions(512, 32, doc_id=str(d), seed=0,
                                                                                        samples_per_bucket=4))
    base = full.isel(sample=np.flatnonzero(keep))
    moved = base.assign(q=base.q * (1 + 0.2 * (base.position / 512)))  # a condition that changes the queries
    return full, base, {"baseline": base, "same": base.copy(), "moved": moved}


def test_reseeded_captures_are_the_captures_other_seeds_take():
    full, base, _ = _planted_conditions()
    own, other = reseeded_captures(full, base, [0, 1])
    for name in ("q", "k", "position", "doc"):
        np.testing.assert_array_equal(own[name].values, base[name].values, err_msg=name)
    assert other.attrs["seed"] == 1 and not np.array_equal(other.position.values, base.position.values)
    assert abs(other.sizes["sample"] - base.sizes["sample"]) < 0.3 * base.sizes["sample"]


def test_condition_table_pairs_documents_and_reads_against_the_null():
    full, base, conds = _planted_conditions()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        values, diffs = condition_table(conds)
        null = reseed_null(full, base, 19)
        est = model_level_terms(base)
    v = values.set_index(["condition", "quantity"])
    for q in QUANTITIES:
        assert v.loc[("baseline", q), "estimate"] == pytest.approx(est[q], abs=1e-12)
        assert v.loc[("baseline", q), "lo"] <= est[q] <= v.loc[("baseline", q), "hi"]
    same = diffs[diffs.condition == "same"]
    assert np.allclose(same.estimate, 0) and np.allclose(same.lo, 0) and np.allclose(same.hi, 0)  # identical captures
    assert null.shape == (19, len(QUANTITIES)) and (null.std() > 0).all()
    reading = read_conditions(diffs, null, "ap_drop")
    assert reading.attrs["n_null"] == 19 and reading.attrs["floor"] == pytest.approx(1 / 20)
    assert reading.loc["same", "p (null rank)"] == 1.0 and reading.loc["same", "verdict"] == "left open"
    assert set(reading.verdict) <= {"supported", "left open", "no effect"}
    assert (reading["p (Holm)"] >= reading["p (null rank)"]).all()


def test_the_reseeded_null_is_each_reseeded_baselines_own_analysis():
    """The batched null (the reseeded baselines as cuts of the capture at every position, each drawing its own
    pairs) holds, seed by seed, model_level_terms of reseeded_captures' captures minus the baseline's."""
    full, base, _ = _planted_conditions()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        null = reseed_null(full, base, 6)
        ref = np.array(list(model_level_terms(base).values()))
        own = np.array([list(model_level_terms(cap).values()) for cap in
                        reseeded_captures(full, base, int(base.attrs["seed"]) + 1 + np.arange(6))]) - ref
    assert list(null.index) == list(int(base.attrs["seed"]) + 1 + np.arange(6)) and list(null.columns) == list(QUANTITIES)
    np.testing.assert_allclose(null.to_numpy(), own, rtol=1e-12, atol=1e-14)


def test_the_null_and_the_jackknives_are_kept_and_read_back(tmp_path, monkeypatch):
    """With a store the products are computed once and read back; another setting computes them again."""
    import qkplast.analysis.decompose as decompose
    from qkplast.rundir import product_store

    full, base, conds = _planted_conditions()
    calls = []
    batched = decompose.model_level_terms_of_cuts
    monkeypatch.setattr(decompose, "model_level_terms_of_cuts", lambda *a, **k: calls.append(1) or batched(*a, **k))
    store = product_store(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        first = reseed_null(full, base, 5, store=store)
        values, diffs = condition_table(conds, store=store)
        made = len(calls)
        again = reseed_null(full, base, 5, store=store)
        values2, diffs2 = condition_table(conds, store=store)
        assert len(calls) == made  # read back: nothing computed
        other = reseed_null(full, base, 4, store=store)  # another setting: computed, kept beside the first
    assert len(calls) > made and len(other) == 4
    pd.testing.assert_frame_equal(first, again)
    pd.testing.assert_frame_equal(values, values2) and pd.testing.assert_frame_equal(diffs, diffs2)
    assert {p.name for p in (tmp_path / "conditions").glob("*.nc")} >= {
        "reseed-null.nc", "jackknife-baseline.nc", "jackknife-same.nc", "jackknife-moved.nc"}
    fresh_values, _ = condition_table(conds)
    pd.testing.assert_frame_equal(values, fresh_values)  # what is read back is what is computed
