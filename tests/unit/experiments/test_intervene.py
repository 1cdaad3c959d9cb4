"""Interventions: identity, restoration, ablation semantics, the clamp verified by re-capture on tiny models, bad
input (on the embedded model: tests/integration/experiments/test_intervene.py)."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from qkplast.capture.driver import capture
from qkplast.options import CaptureOptions
from qkplast.capture.corpus import Document
from qkplast.experiments.intervene import (
    InterventionError,
    ablate_heads,
    clamp_bias,
    composed,
    head_mean_outputs,
    select_heads,
)
from qkplast.errors import QkplastError
from qkplast.experiments.calibrate import calibrate_clamp, capture_windows
from tests.helpers import rotation_metrics, tiny_model, tiny_tokenizer

IDS = (torch.arange(48)[None] * 7) % 300  # [batch, seq]


def _logits(model, ids=IDS):
    with torch.inference_mode():
        return model(ids).logits


def _docs():
    from pydoc_data.topics import topics

    return [Document(name, topics[name]) for name in ("assert", "for", "if", "while")]


def _capture(model, tokenizer, seq_len=64, docs=4):
    options = CaptureOptions(seq_len=seq_len, bucket_size=8, samples_per_bucket=8, heads=None, docs=docs,
                             short_docs="concat")
    return capture(model, tokenizer, _docs(), options=options, progress=False)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(3)
    return tiny_model("llama")


@pytest.fixture(scope="module")
def llama_metrics(llama, tokenizer):
    return rotation_metrics(_capture(llama, tokenizer))


def test_empty_interventions_are_bit_identical(llama, llama_metrics):
    before = _logits(llama)
    with ablate_heads(llama, []):
        inside = _logits(llama)
    with clamp_bias(llama, llama_metrics, [], mode="key"):
        inside_clamp = _logits(llama)
    assert torch.equal(before, inside) and torch.equal(before, inside_clamp)


@pytest.mark.parametrize("kind", ["zero", "mean", "query", "key", "both"])
def test_model_is_unchanged_after_exit(llama, llama_metrics, kind):
    before = _logits(llama)
    heads = [(0, 1), (2, 3)]
    if kind in ("zero", "mean"):
        ref = None if kind == "zero" else np.full((3, 4, 8), 0.5)
        ctx = ablate_heads(llama, heads, mode=kind, reference=ref)
    else:
        ctx = clamp_bias(llama, llama_metrics, heads, mode=kind)
    with ctx:
        inside = _logits(llama)
    after = _logits(llama)
    assert not torch.allclose(before, inside)  # the intervention did something
    assert torch.equal(before, after)
    assert llama.config._attn_implementation == "sdpa"
    assert all(not m._forward_pre_hooks for m in llama.modules())


def test_zero_ablation_zeroes_exactly_the_head_slice(llama):
    seen = {}
    attn = llama.model.layers[1].self_attn
    # a forward hook sees the input after every pre-hook, i.e. what o_proj multiplies
    handle = attn.o_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("x", a[0].clone()))
    try:
        _logits(llama)
        plain = seen["x"]
        with ablate_heads(llama, [(1, 2)]):
            _logits(llama)
        ablated = seen["x"]
    finally:
        handle.remove()
    hd = attn.head_dim
    assert torch.all(ablated[..., 2 * hd: 3 * hd] == 0)
    assert torch.equal(ablated[..., : 2 * hd], plain[..., : 2 * hd])
    assert torch.equal(ablated[..., 3 * hd:], plain[..., 3 * hd:])
    assert not torch.all(plain[..., 2 * hd: 3 * hd] == 0)


def test_mean_ablation_with_zero_reference_equals_zero_ablation(llama):
    heads = [(0, 0), (1, 3), (2, 1)]
    with ablate_heads(llama, heads):
        zero = _logits(llama)
    with ablate_heads(llama, heads, mode="mean", reference=np.zeros((3, 4, 8))):
        mean = _logits(llama)
    assert torch.equal(zero, mean)


def test_head_mean_outputs_is_the_average_slice(llama):
    windows = [np.arange(20) % 300, (np.arange(20) * 5) % 300]
    mean = head_mean_outputs(llama, windows)
    seen = []
    h = llama.model.layers[2].self_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].double()))
    try:
        for w in windows:
            _logits(llama, torch.as_tensor(w)[None])
    finally:
        h.remove()
    direct = torch.cat(seen, 1).unflatten(-1, (4, 8)).mean((0, 1))  # [q_head, dim]
    np.testing.assert_allclose(mean.sel(layer=2).values, direct.numpy(), rtol=1e-10, atol=1e-12)
    with ablate_heads(llama, [(2, 1)], mode="mean", reference=windows):
        from_windows = _logits(llama)
    with ablate_heads(llama, [(2, 1)], mode="mean", reference=mean):
        from_mean = _logits(llama)
    assert torch.equal(from_windows, from_mean)


@pytest.mark.parametrize("mode", ["query", "key"])
def test_clamp_removes_bias_on_recapture(llama, tokenizer, llama_metrics, mode):
    heads = [(1, 0), (1, 3)] if mode == "query" else [(1, 0)]  # one layer: no upstream clamp moves the inputs
    rows = [int(np.flatnonzero((llama_metrics.layer.values == lay) & (llama_metrics.q_head.values == h))[0])
            for lay, h in heads]
    before = np.abs(llama_metrics.bias_strength.values[rows])
    assert (before > 0).all()
    with clamp_bias(llama, llama_metrics, heads, mode=mode):
        after = rotation_metrics(_capture(llama, tokenizer))
    ratio = np.abs(after.bias_strength.values[rows]) / before
    assert (ratio < 0.05).all(), ratio
    if mode == "query":
        np.testing.assert_allclose(after.mu_q_a.values[rows], 0, atol=1e-5)
    else:
        np.testing.assert_allclose(after.alpha_k.values[rows], 0, atol=1e-5 * np.abs(llama_metrics.alpha_k.values).max())
    # heads of other layers below the clamped one are untouched
    low = llama_metrics.layer.values == 0
    np.testing.assert_allclose(after.bias_strength.values[low], llama_metrics.bias_strength.values[low], rtol=1e-4)


def test_key_clamp_acts_on_the_whole_gqa_group(llama, tokenizer, llama_metrics):
    plain = _capture(llama, tokenizer, docs=1)
    with clamp_bias(llama, llama_metrics, [(1, 0)], mode="key"):
        clamped = _capture(llama, tokenizer, docs=1)
    sel = lambda ds, h: ds.k.values[(ds.layer.values == 1) & (ds.q_head.values == h)]  # noqa: E731
    assert not np.allclose(sel(plain, 1), sel(clamped, 1))  # q_head 1 shares kv_head 0 with q_head 0
    np.testing.assert_array_equal(sel(plain, 2), sel(clamped, 2))  # kv_head 1 untouched
    with clamp_bias(llama, llama_metrics, [(1, 0)], mode="query"):
        q_only = _capture(llama, tokenizer, docs=1)
    selq = lambda ds, h: ds.q.values[(ds.layer.values == 1) & (ds.q_head.values == h)]  # noqa: E731
    np.testing.assert_array_equal(selq(plain, 1), selq(q_only, 1))  # the query clamp is per query head


def test_interventions_compose_with_each_other_and_the_capture(llama, tokenizer, llama_metrics):
    before = _logits(llama)
    with ablate_heads(llama, [(0, 2)]):
        ablated = _logits(llama)
        with clamp_bias(llama, llama_metrics, [(1, 0)], mode="query"):
            both = _logits(llama)
            cap = _capture(llama, tokenizer, docs=1)
    with composed(clamp_bias(llama, llama_metrics, [(1, 0)], mode="query"), ablate_heads(llama, [(0, 2)])):
        both_again = _logits(llama)
    assert torch.equal(both, both_again)
    assert not torch.equal(both, ablated)
    q = cap.q.values[(cap.layer.values == 1) & (cap.q_head.values == 0)][0]  # [sample, dim]
    a = llama_metrics.axis_a.values[(llama_metrics.layer.values == 1) & (llama_metrics.q_head.values == 0)][0]
    np.testing.assert_allclose(q @ a, 0, atol=1e-5)  # the capture inside records the clamped queries
    assert torch.equal(_logits(llama), before)


def test_select_heads(llama_metrics):
    low = select_heads(llama_metrics, 3, "bias_strength")
    high = select_heads(llama_metrics, 3, "bias_strength", largest=True)
    b = {(int(la), int(h)): v for la, h, v in zip(llama_metrics.layer.values, llama_metrics.q_head.values,
                                                  llama_metrics.bias_strength.values)}
    assert max(b[h] for h in low) <= min(b[h] for h in high)
    assert select_heads(llama_metrics, 4, "random", seed=1) == select_heads(llama_metrics, 4, "random", seed=1)
    with pytest.raises(InterventionError, match="k must lie"):
        select_heads(llama_metrics, 99, "random")


@pytest.mark.parametrize("heads, match", [([(3, 0)], "unknown layer 3"), ([(0, 4)], "unknown query head 4"),
                                          ([(0,)], "pairs of integers")])
def test_unknown_heads_are_refused(llama, llama_metrics, heads, match):
    with pytest.raises(InterventionError, match=match):
        with ablate_heads(llama, heads):
            pass
    with pytest.raises(QkplastError, match=match):
        with clamp_bias(llama, llama_metrics, heads):
            pass


def test_bad_modes_and_references_are_refused(llama, llama_metrics):
    with pytest.raises(InterventionError, match="needs reference"):
        with ablate_heads(llama, [(0, 0)], mode="mean"):
            pass
    with pytest.raises(InterventionError, match="shape"):
        with ablate_heads(llama, [(0, 0)], mode="mean", reference=np.zeros((2, 4, 8))):
            pass
    with pytest.raises(InterventionError, match="ablation mode"):
        with ablate_heads(llama, [(0, 0)], mode="noise"):
            pass
    with pytest.raises(InterventionError, match="clamp mode"):
        with clamp_bias(llama, llama_metrics, [(0, 0)], mode="value"):
            pass


def test_metrics_of_another_model_are_refused(llama, tokenizer):
    other = tiny_model("qwen3")  # 4 query heads, 2 kv heads, as llama: coords alone must differ
    met = rotation_metrics(_capture(other, tokenizer, docs=1))
    met.attrs["capture"]["n_layers"] = 5
    with pytest.raises(InterventionError, match="another model"):
        with clamp_bias(llama, met, [(0, 0)]):
            pass
    met = rotation_metrics(_capture(other, tokenizer, docs=1))
    shuffled = met.assign_coords(kv_head=("head", (met.kv_head.values + 1) % 2))
    with pytest.raises(InterventionError, match="GQA grouping"):
        with clamp_bias(llama, shuffled, [(0, 0)]):
            pass
    with pytest.raises(InterventionError, match="head_dim"):
        with clamp_bias(llama, met.isel(dim=slice(0, 4)), [(0, 0)]):
            pass


def test_missing_or_nan_drift_axis_is_refused(llama, llama_metrics):
    nan = llama_metrics.copy(deep=True)
    row = int(np.flatnonzero((nan.layer.values == 1) & (nan.q_head.values == 2))[0])
    nan["axis_a"][row] = np.nan
    with pytest.raises(InterventionError, match=r"no drift axis.*leave them out"):
        with clamp_bias(llama, nan, [(1, 2)]):
            pass
    partial = llama_metrics.isel(head=llama_metrics.layer.values != 2)
    with pytest.raises(InterventionError, match="not in metrics"):
        with clamp_bias(llama, partial, [(2, 0)]):
            pass
    with pytest.raises(InterventionError, match="lack 'axis_a'"):
        with clamp_bias(llama, llama_metrics.drop_vars("axis_a"), [(1, 2)]):
            pass


# --------------------------------------------------------------------------- calibrated clamp

CALIBRATION_HEADS = [(0, 1), (1, 0), (1, 1), (2, 2)]  # three layers; (1, 0) and (1, 1) share key head 0


def _capture_options(seq_len=64, docs=4):
    return CaptureOptions(seq_len=seq_len, bucket_size=8, samples_per_bucket=8, heads=None, docs=docs,
                          short_docs="concat")


def _residual(met, again, heads):
    rows = [int(np.flatnonzero((met.layer.values == la) & (met.q_head.values == h))[0]) for la, h in heads]
    return np.abs(again.bias_strength.values[rows]) / np.abs(met.bias_strength.values[rows])


@pytest.mark.parametrize("mode", ["query", "key"])
def test_calibrated_clamp_zeroes_the_bias_of_every_clamped_layer(llama, tokenizer, llama_metrics, mode):
    """Clamps in several layers: the plain clamp leaves bias above the lowest clamped layer (its inputs moved);
    calibrated on the capture's own windows and positions, the re-capture finds none on any clamped head."""
    ids, mask = capture_windows(tokenizer, _docs(), _capture_options())
    assert mask.sum(1).min() > 0 and ids.shape == (4, 64)
    with clamp_bias(llama, llama_metrics, CALIBRATION_HEADS, mode=mode):
        plain_clamp = rotation_metrics(_capture(llama, tokenizer))
    calibrated = calibrate_clamp(llama, llama_metrics, CALIBRATION_HEADS, ids, mode=mode, positions=mask)
    assert calibrated.attrs["clamp_calibration"]["positions"] == int(mask.sum())
    with clamp_bias(llama, calibrated, CALIBRATION_HEADS, mode=mode):
        again = rotation_metrics(_capture(llama, tokenizer))
    residual, before = _residual(llama_metrics, again, CALIBRATION_HEADS), _residual(
        llama_metrics, plain_clamp, CALIBRATION_HEADS)
    assert (residual < 1e-3).all(), residual
    assert before.max() > 100 * residual.max(), (before, residual)  # the plain clamp left measurable bias
    # the lowest clamped layer sees the plain model's inputs: its calibrated axis is the plain one
    row = int(np.flatnonzero((llama_metrics.layer.values == 0) & (llama_metrics.q_head.values == 1))[0])
    np.testing.assert_allclose(calibrated.axis_a.values[row], llama_metrics.axis_a.values[row], atol=1e-5)


@pytest.mark.parametrize("mode", ["query", "key"])
def test_calibration_and_capture_in_one_pass_equal_a_re_capture_inside_the_calibrated_clamp(
        llama, tokenizer, llama_metrics, mode):
    """The capture taken in the calibrating pass is the one a second pass inside the calibrated clamp takes:
    same calibration (every variable) and the same Q/K, so the chapter's re-capture needs no second forward."""
    from qkplast.experiments.calibrate import calibrate_and_capture

    options = _capture_options(docs=1)
    ids, mask = capture_windows(tokenizer, _docs(), options)
    separate = calibrate_clamp(llama, llama_metrics, CALIBRATION_HEADS, ids, mode=mode, positions=mask)
    with clamp_bias(llama, separate, CALIBRATION_HEADS, mode=mode):
        again = capture(llama, tokenizer, _docs(), options=options, progress=False)
    calibrated, in_pass = calibrate_and_capture(llama, tokenizer, _docs(), llama_metrics, CALIBRATION_HEADS, options,
                                                mode=mode)
    for name in ("axis_a", "alpha_k", "mu_q_a", "bias_strength", "key_drift"):
        # the same measurement; the key drift's least-squares steps may round differently in the last bit
        np.testing.assert_allclose(calibrated[name].values, separate[name].values, rtol=1e-12, atol=0, err_msg=name)
    assert calibrated.attrs["clamp_calibration"] == separate.attrs["clamp_calibration"]
    np.testing.assert_array_equal(in_pass.q.values, again.q.values)
    np.testing.assert_array_equal(in_pass.k.values, again.k.values)
    plain = capture(llama, tokenizer, _docs(), options=options, progress=False)
    assert not np.array_equal(in_pass.q.values, plain.q.values) or not np.array_equal(in_pass.k.values, plain.k.values)
    assert (_residual(llama_metrics, rotation_metrics(in_pass), CALIBRATION_HEADS) < 1e-3).all()
    with pytest.raises(InterventionError, match="docs=1"):
        calibrate_and_capture(llama, tokenizer, _docs(), llama_metrics, CALIBRATION_HEADS, _capture_options(docs=2))


def test_calibrated_key_drift_serves_every_head_of_the_group(llama, llama_metrics):
    """Two clamped query heads on one key head: the drift zeroes both slopes on their re-fitted axes."""
    from qkplast.experiments.calibrate import calibrated_drift

    gen = torch.Generator().manual_seed(0)
    sq, sk = torch.randn(2, 16, generator=gen, dtype=torch.float64), torch.randn(16, generator=gen, dtype=torch.float64)
    stt = torch.tensor(40.0, dtype=torch.float64)
    v = calibrated_drift(sq, sk.expand(2, -1), stt)
    u = sk - stt * v
    axes = (sq + u) / torch.linalg.vector_norm(sq + u, dim=-1, keepdim=True)
    assert float((axes @ u).abs().max()) < 1e-10 * float(torch.linalg.vector_norm(sk))
    one = calibrated_drift(sq[:1], sk[None], stt)  # one head: v = alpha_K a, the plain clamp's drift
    a = (sq[0] + sk) / torch.linalg.vector_norm(sq[0] + sk)
    torch.testing.assert_close(one, (a @ sk) / stt * a)


def test_calibration_refuses_bad_windows(llama, llama_metrics):
    with pytest.raises(InterventionError, match="input_ids must be"):
        calibrate_clamp(llama, llama_metrics, [(1, 0)], np.zeros(10, dtype=int))
    with pytest.raises(InterventionError, match="positions must be"):
        calibrate_clamp(llama, llama_metrics, [(1, 0)], np.zeros((2, 16), dtype=int), positions=np.zeros((2, 8)))


def test_a_calibrated_clamp_is_refused_for_other_heads_or_modes(llama, llama_metrics):
    ids = np.arange(64)[None] % 300  # [batch, seq]
    calibrated = calibrate_clamp(llama, llama_metrics, [(1, 0)], ids, mode="key")
    with clamp_bias(llama, calibrated, [(1, 0)], mode="key"):
        pass
    with pytest.raises(InterventionError, match="calibrated for mode 'key'"):
        with clamp_bias(llama, calibrated, [(1, 0)], mode="query"):
            pass
    with pytest.raises(InterventionError, match="calibrate those"):
        with clamp_bias(llama, calibrated, [(1, 0), (2, 1)], mode="key"):
            pass
