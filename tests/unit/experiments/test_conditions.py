"""Content-decay conditions (beyond the thesis, 7.6): the interventions are exact and reversible, the bootstrap is consistent."""

import warnings

import numpy as np
import pytest
import torch
import transformers as T

from qkplast.experiments.conditions import (QUANTITIES, bootstrap_parts, condition_grid, document_sums, first_keys_mask,
                                first_keys_masked, parts_from_weights, rope_base_scaled)
from qkplast.analysis.decompose import counterfactual_ap, decompose_drop
from qkplast.analysis.plasticity import edge_masks
from qkplast.options import AnalysisOptions
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
    assert list(grid) == ["baseline", "baseline_reseeded", "rope_x0.5", "rope_x2", "window_2048", "bos", "mid_document",
                          "mask_first_4"]
    assert grid["mid_document"]["start"] == 512 and grid["window_2048"]["seq_len"] == 2048
    with pytest.raises(ValueError, match="unknown sink"):
        condition_grid(1024, (), (), ("sinks",), 4, 512)


def test_document_sums_reproduce_the_decomposition():
    cap = planted_capture(n_heads=3, dim=16, n_docs=12, samples_per_bucket=4, seed=5)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        sums, counts, docs, tau = document_sums(cap)
        cf = counterfactual_ap(cap)
        dec = decompose_drop(cap)
        boot = bootstrap_parts(cap, n_boot=1000, seed=1)
    with np.errstate(invalid="ignore"):
        prof = sums.sum(-1) / counts.sum(-1)
    np.testing.assert_allclose(prof, cf.values, rtol=1e-12, atol=1e-14)
    first, last = edge_masks(tau, cap.attrs["seq_len"], AnalysisOptions())
    est = parts_from_weights(sums, counts, np.ones((1, len(docs))), first, last)[0]
    expect = [float(dec[n].mean()) for n in ("ap_drop_bias", "ap_drop_content", "ap_drop_interaction", "ap_drop_keys")]
    np.testing.assert_allclose(est[1:], expect, atol=1e-12)
    assert est[0] == pytest.approx(est[1] + est[2] + est[3], abs=1e-12)
    assert boot["replicates"].shape == (1000, len(QUANTITIES))
    lo, hi = np.quantile(boot["replicates"], [0.025, 0.975], axis=0)
    assert (hi > lo).all() and (lo[:4] <= est[:4] + 0.05).all() and (hi[:4] >= est[:4] - 0.05).all()
