"""The window recorder: index tensors follow the query's device; non-finite vectors are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkplast.capture.architecture import LayerInfo, ArchitectureSpec
from qkplast.capture.recorder import DeviceIndexCache, NonFiniteCaptureError, WindowRecorder
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
    recorder.observe(mods[1], q, k, {})
