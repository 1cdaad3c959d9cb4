"""The window recorder: index tensors follow the query's device; non-finite vectors are refused by name; the
forward pass stops at the last planned layer, with the rows a full forward gives."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from qkplast.capture.architecture import LayerInfo, ArchitectureSpec
from qkplast.capture.recorder import CaptureComplete, Capturer, DeviceIndexCache, NonFiniteCaptureError, WindowRecorder
from qkplast.capture.sampling import sample_heads


def _layout(modules):
    layers = [LayerInfo(0, True, True), LayerInfo(1, True, True)]
    return ArchitectureSpec(layers, 4, 2, 8, "llama", True, modules)


def test_index_cache_makes_one_copy_per_device_keyed_by_the_device():
    cache = DeviceIndexCache(np.array([1, 5, 9]), {0: (np.array([0, 3]), np.array([0, 1]))})
    assert cache.key(torch.device("cpu")) == cache.key("cpu")
    assert cache.key("cuda:1") == "cuda:1" and cache.key(torch.device("cuda", 0)) == "cuda:0"
    positions, heads = cache.on(torch.device("cpu"))
    assert positions.device.type == "cpu" and positions.tolist() == [1, 5, 9]
    again, _ = cache.on("cpu")
    assert again is positions  # cached, not copied again
    meta_positions, meta_heads = cache.on("meta")  # a second real device available without a GPU
    assert meta_positions.device.type == "meta" and meta_heads[0][0].device.type == "meta"
    assert cache.devices == ["cpu", "meta"]
    assert heads[0][0].tolist() == [0, 3] and heads[0][1].tolist() == [0, 1]


class _Module:
    pass


def _recorder(doc_id="doc 7"):
    mods = [_Module(), _Module()]
    layout = _layout({id(mods[0]): 0, id(mods[1]): 1})
    plan = sample_heads(layout, heads=None)
    return mods, WindowRecorder(layout, plan, np.array([0, 2, 3]), doc_id=doc_id)


def test_indices_follow_each_querys_device():
    mods, recorder = _recorder()
    q = torch.randn(1, 4, 6, 8)  # [batch, n_q, seq, dim]
    k = torch.randn(1, 2, 6, 8)  # [batch, n_kv, seq, dim]
    recorder.observe(mods[0], q, k, {})
    # Layer 1 lives on another device (as with device_map="auto"): its query arrives on "meta".
    # Meta tensors hold no values, so the finiteness check fails -- after the rows were selected with indices
    # the recorder made on the query's own device.
    with pytest.raises(RuntimeError, match="meta"):
        recorder.observe(mods[1], q.to("meta"), k.to("meta"), {})
    assert recorder.indices.devices == ["cpu", "meta"]
    positions, heads = recorder.indices.on("meta")
    assert positions.device.type == "meta" and heads[1][0].device.type == "meta"
    with pytest.raises(CaptureComplete):  # the last planned layer: the forward pass may stop here
        recorder.observe(mods[1], q, k, {})
    got_q, got_k = recorder.result()
    np.testing.assert_array_equal(got_q[:4], q[0][:, [0, 2, 3]].numpy())
    np.testing.assert_array_equal(got_k[:4], k[0][[0, 0, 1, 1]][:, [0, 2, 3]].numpy())


def test_non_finite_vectors_name_document_layer_and_head():
    mods, recorder = _recorder("LBP/ä 3")
    q = torch.randn(1, 4, 6, 8)
    k = torch.randn(1, 2, 6, 8)
    recorder.observe(mods[0], q, k, {})  # layer 0 is clean
    q[0, 2, 3, 1] = float("nan")  # position 3 is sampled
    with pytest.raises(NonFiniteCaptureError, match=r"document 'LBP/ä 3', layer 1, q_head\(s\) \[2\]"):
        recorder.observe(mods[1], q, k, {})
    q[0, 2, 3, 1] = 0.0
    k[0, 0, 0, 0] = float("inf")  # a bad key head poisons both query heads of its group
    with pytest.raises(NonFiniteCaptureError, match=r"q_head\(s\) \[0, 1\]"):
        recorder.observe(mods[1], q, k, {})
    q[0, 1, 4, 0] = float("nan")  # an unsampled row is not captured and not an error
    k[0, 0, 0, 0] = 0.0
    with pytest.raises(CaptureComplete):
        recorder.observe(mods[1], q, k, {})


def _tiny_llama(layers=4):
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, vocab_size=100, max_position_embeddings=128)
    return T.LlamaForCausalLM(cfg).eval()


def _layers_run(model, run):
    """``run()``'s result and the decoder layers (by index) whose MLP ran, then ``"norm"`` if the final norm did."""
    ran = []
    handles = [layer.mlp.register_forward_hook(lambda *_, i=i: ran.append(i))
               for i, layer in enumerate(model.model.layers)]
    handles.append(model.model.norm.register_forward_hook(lambda *_: ran.append("norm")))
    try:
        result = run()
    finally:
        for h in handles:
            h.remove()
    return result, ran


def test_the_forward_stops_at_the_last_planned_layer_with_the_rows_of_a_full_forward():
    model = _tiny_llama()
    ids = np.random.default_rng(0).integers(0, 100, 64)
    positions = np.array([0, 5, 17, 40, 63])
    full = Capturer(model, heads=None)  # every layer planned: the last one's attention kernel, mlp and norm skipped
    calls = []
    with full:
        (q_all, k_all), ran = _layers_run(model, lambda: full.capture_window(ids, positions,
                                                                               on_call=lambda: calls.append(1)))
    assert ran == [0, 1, 2]
    assert len(calls) == full.calls_per_window == 4  # a window's progress bar ends full
    low = Capturer(model, heads=None)
    keep = low.plan.layer <= 1
    low.plan = replace(low.plan, layer=low.plan.layer[keep], q_head=low.plan.q_head[keep],
                       kv_head=low.plan.kv_head[keep], rope=low.plan.rope[keep])  # the heads of layers 0 and 1
    calls.clear()
    with low:
        (q_low, k_low), ran = _layers_run(model, lambda: low.capture_window(ids, positions,
                                                                             on_call=lambda: calls.append(1)))
    assert ran == [0]  # layers 2 and 3 never run
    assert len(calls) == low.calls_per_window == 2 < low.layout.calls_per_forward  # the bar ends full here too
    first_two = np.flatnonzero(full.plan.layer <= 1)
    np.testing.assert_array_equal(q_low, q_all[first_two])  # bit for bit the rows of the longer forward
    np.testing.assert_array_equal(k_low, k_all[first_two])
    # the bare forward a benchmark times against it stops at the same layer
    assert _layers_run(model, lambda: low.bare_forward(ids))[1] == [0]
    assert _layers_run(model, lambda: full.bare_forward(ids))[1] == [0, 1, 2]
    with low, pytest.raises(Exception, match="outside"):
        low.bare_forward(ids)
