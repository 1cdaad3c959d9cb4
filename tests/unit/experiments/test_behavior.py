"""Behaviour by distance: planting, scoring against the model's own logits, passkey prompts (the embedded model:
tests/integration/experiments/test_behavior.py)."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from tests.helpers import tiny_model, tiny_tokenizer

from qkplast.experiments.behavior import (
    BehaviorError,
    copy_by_distance,
    loss_by_position,
    passkey_by_depth,
    plant_segments,
    token_scores,
)
from qkplast.capture.corpus import Document


def _docs():
    from pydoc_data.topics import topics

    return [Document(name, topics[name]) for name in ("assert", "for", "if", "while", "try")]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(5)
    return tiny_model("llama")


def test_plant_segments_places_disjoint_equal_copies():
    rng = np.random.default_rng(0)
    base = np.arange(200) % 7
    ids, first, second = plant_segments(base, [30, 90, 150], 10, rng, np.arange(100, 300))
    np.testing.assert_array_equal(second - first, [30, 90, 150])
    starts = np.sort(np.concatenate([first, second]))
    assert (np.diff(starts) >= 10).all() and starts[0] >= 1 and starts[-1] + 10 <= 200
    seg = np.stack([ids[f: f + 10] for f in first])
    np.testing.assert_array_equal(seg, np.stack([ids[s: s + 10] for s in second]))
    assert len(np.unique(seg)) == seg.size  # no token shared between or within segments
    untouched = np.ones(200, bool)
    for s in starts:
        untouched[s: s + 10] = False
    np.testing.assert_array_equal(ids[untouched], base[untouched])


def test_plant_segments_refuses_what_cannot_fit():
    rng = np.random.default_rng(0)
    with pytest.raises(BehaviorError, match="longer seq_len"):
        plant_segments(np.zeros(100, int), [90], 24, rng, np.arange(50, 300))
    with pytest.raises(BehaviorError, match="at least seg_len"):
        plant_segments(np.zeros(100, int), [10], 24, rng, np.arange(50, 300))


def test_token_scores_match_the_full_logits(llama):
    ids = (torch.arange(60)[None] * 11 + torch.tensor([[0], [3]])) % 300  # [batch, seq]
    pos = torch.tensor([[1, 17, 59], [5, 6, 40]])
    nll, hit = token_scores(llama, ids, pos)
    with torch.inference_mode():
        logp = torch.log_softmax(llama(ids).logits.double(), -1)  # [batch, seq, vocab]
    rows = torch.arange(2)[:, None]
    want = -logp[rows, pos - 1, ids[rows, pos]]
    torch.testing.assert_close(nll, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(hit, logp[rows, pos - 1].argmax(-1) == ids[rows, pos])


def test_token_scores_chunks_the_lm_head_by_bytes(llama):
    """The head sees at most the rows a byte budget allows (its output, float64 copy, log_softmax), same result."""
    from qkplast.capture.plan import logits_bytes_per_row, logits_chunk_rows

    ids = (torch.arange(60)[None] * 7 + torch.tensor([[1], [4]])) % 300  # [batch, seq]
    pos = torch.arange(1, 60).expand(2, -1)  # [batch, position]
    head = llama.get_output_embeddings()
    per_row = logits_bytes_per_row(head.weight.shape[0], head.weight.element_size())
    assert per_row == 300 * (4 + 8 + 8)
    seen = []
    hook = head.register_forward_hook(lambda m, a, out: seen.append(a[0].shape[0]))
    try:
        small = token_scores(llama, ids, pos, chunk_bytes=7 * per_row)
        whole = token_scores(llama, ids, pos, chunk_bytes=10**9)
    finally:
        hook.remove()
    assert logits_chunk_rows(300, 4, 7 * per_row) == 7
    assert max(seen[:-1]) == 7 and len(seen) - 1 == -(-2 * 59 // 7) and seen[-1] == 2 * 59
    torch.testing.assert_close(small[0], whole[0], rtol=1e-5, atol=1e-6)  # float32 head, rows grouped differently
    assert torch.equal(small[1], whole[1])


def test_copy_by_distance_layout_and_determinism(llama, tokenizer):
    kw = dict(windows=2, seq_len=128, seg_len=8, seed=3)
    ds = copy_by_distance(llama, tokenizer, _docs(), [16, 40, 100], **kw)
    assert ds.acc.dims == ("window", "distance") and ds.sizes == {"window": 2, "distance": 3}
    assert ((ds.acc >= 0) & (ds.acc <= 1)).all() and (ds.nll > 0).all()
    np.testing.assert_array_equal(ds.second - ds.first, np.broadcast_to([16, 40, 100], (2, 3)))
    again = copy_by_distance(llama, tokenizer, _docs(), [16, 40, 100], **kw)
    np.testing.assert_array_equal(ds.nll, again.nll)
    apart = copy_by_distance(llama, tokenizer, _docs(), [16, 40, 100], together=False, **kw)
    assert apart.sizes == ds.sizes and np.isfinite(apart.nll).all()
    with pytest.raises(BehaviorError, match="windows"):
        copy_by_distance(llama, tokenizer, _docs(), [16], windows=500, seq_len=128)
    with pytest.raises(BehaviorError, match="distinct"):
        copy_by_distance(llama, tokenizer, _docs(), [16, 16], windows=1, seq_len=128)


def test_loss_by_position_matches_cross_entropy(llama, tokenizer):
    ds = loss_by_position(llama, tokenizer, _docs(), windows=2, seq_len=64)
    assert ds.nll.dims == ("window", "position") and ds.position.values[0] == 1 and ds.sizes["position"] == 63
    from qkplast.capture.corpus import iter_windows

    w = next(iter_windows(_docs(), tokenizer, 64)).input_ids
    with torch.inference_mode():
        logits = llama(torch.as_tensor(w)[None]).logits[0, :-1].double()
    ce = torch.nn.functional.cross_entropy(logits, torch.as_tensor(w[1:]), reduction="none")
    np.testing.assert_allclose(ds.nll.values[0], ce.numpy(), rtol=1e-5, atol=1e-6)


def test_passkey_prompt_layout(llama, tokenizer):
    ds = passkey_by_depth(llama, tokenizer, _docs(), [0.0, 0.5, 1.0], windows=2, seq_len=128, digits=4)
    assert ds.acc.dims == ("window", "depth") and set(np.unique(ds.acc)) <= {0.0, 1.0}
    assert (ds.logp < 0).all()
    assert (np.diff(ds.distance.values, axis=1) < 0).all()  # deeper needle, closer to the question
    with pytest.raises(BehaviorError, match="fractions"):
        passkey_by_depth(llama, tokenizer, _docs(), [1.5], windows=1, seq_len=128)


def test_matched_context_cells_differ_only_in_which_span_holds_the_first_copy():
    from qkplast.experiments.behavior import CopyDesign

    design = CopyDesign(window=256, seg_len=16, positions=(160, 240), distances=(32, 128), matched_context=True)
    base = np.arange(256) % 11
    cand = np.arange(100, 400)
    seqs = [design.planted(base, np.random.default_rng([0, 3]), cand, s) for s in range(2)]
    spans = design.spans(0)
    assert spans == design.spans(1) == [32, 112, 128, 160, 208, 240]
    inside = np.zeros(256, bool)
    for x in spans:
        inside[x: x + 16] = True
    np.testing.assert_array_equal(seqs[0][~inside], base[~inside])  # natural text untouched outside the spans
    np.testing.assert_array_equal(seqs[0][~inside], seqs[1][~inside])  # the two sequences differ only inside them
    for s, cells in enumerate(design.sequences()):
        for p, d in cells:
            seg = seqs[s][p: p + 16]
            np.testing.assert_array_equal(seqs[s][p - d: p - d + 16], seg)  # the first copy at the cell's distance
            other = [dd for dd in design.distances if dd != d][0]
            assert not set(seqs[s][p - other: p - other + 16]) & set(seg)  # a distractor at the other distance
        # the second copy at each position is the same segment in both sequences: its local context is matched
    np.testing.assert_array_equal(seqs[0][160:176], seqs[1][160:176])
    np.testing.assert_array_equal(seqs[0][240:256], seqs[1][240:256])
    # the design refuses spans that overlap once every distance is planted at every position
    with pytest.raises(BehaviorError, match="matched_context"):
        CopyDesign(window=256, seg_len=16, positions=(144, 240), distances=(16, 112), matched_context=True)


def test_matched_context_keeps_the_scoring(llama, tokenizer):
    from qkplast.experiments.behavior import CopyDesign, copy_cells, token_scores

    design = CopyDesign(window=96, seg_len=6, positions=(44, 88), distances=(10, 30), matched_context=True)
    windows = [np.arange(96) % 50 + 3, (np.arange(96) * 7) % 50 + 3]
    out = copy_cells(llama, tokenizer, windows, design, seed=2)
    assert out.attrs["matched_context"] == 1 and np.isfinite(out.nll).all()
    # one cell recomputed by hand from the planted sequence: the scores are the repeat's tokens 2..seg_len
    from qkplast.experiments.behavior import _candidate_tokens

    cand = _candidate_tokens(tokenizer, llama.config.vocab_size)
    ids = design.planted(windows[1], np.random.default_rng([2, 1]), cand, 1)
    (p, d) = design.sequences()[1][0]
    nll, _ = token_scores(llama, torch.as_tensor(ids[None]), torch.as_tensor(np.arange(p + 1, p + 6)[None]))
    assert float(out.nll.sel(position=p, distance=d)[1]) == pytest.approx(float(nll.mean()), rel=1e-6)
