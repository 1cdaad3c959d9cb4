"""Long-range behaviour measured by distance: copying, per-position loss, passkey retrieval.

The thesis measures geometry; its causal questions (sections 7.5, 7.6) need a
behaviour that depends on distance, measured on the same model and corpus, so
that an intervention (:mod:`qkplast.experiments.intervene`) can be scored by how far the
information it needs lies.

``copy_cells``
    The design of the interventions chapter: copies at set second-copy
    positions *and* set distances (:class:`CopyDesign`), so that distance can
    be varied with the second copy's absolute position held fixed, and the
    reverse; one window per document (:func:`document_windows`), the
    independent unit.
``copy_by_distance``
    A random segment of ``seg_len`` token ids is planted into a real corpus
    window and planted again ``distance`` tokens later; the model reads the
    second copy and is scored on predicting its tokens 2..``seg_len`` (the
    first token of the repeat cannot be inferred from anything before it). A
    random segment carries no meaning the model could guess, so above-chance
    accuracy is retrieval from ``distance`` tokens back (induction).
``loss_by_position``
    Next-token loss at every position of the corpus windows.
``passkey_by_depth``
    A prompted passkey retrieval: a key of random digits stated at a relative
    depth of a real corpus window, asked for at the end; accuracy is greedy
    exact match (every digit the top-1 prediction given the digits before it,
    which is what greedy decoding would emit) and the log-probability of the
    digits.

All three run the decoder without cache and apply the output head only at the
scored positions, in chunks sized in bytes (:func:`token_scores`), so a window
never materialises its ``seq x vocab`` logits at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from qkplast.errors import QkplastError
from qkplast.capture.corpus import Corpus, Document, iter_windows
from qkplast.capture.plan import LOGITS_CHUNK_BYTES, logits_chunk_rows

__all__ = [
    "BehaviorError",
    "CopyDesign",
    "copy_cells",
    "document_windows",
    "plant_segments",
    "copy_by_distance",
    "loss_by_position",
    "passkey_by_depth",
    "token_scores",
]


class BehaviorError(QkplastError):
    """A behaviour measurement cannot be set up as asked (the message names the fix)."""


def token_windows(corpus, tokenizer, seq_len: int, windows: int) -> list[np.ndarray]:
    if windows <= 0:
        raise BehaviorError(f"windows must be positive, got {windows}")
    if isinstance(corpus, np.ndarray) or (isinstance(corpus, list) and corpus and isinstance(corpus[0], np.ndarray)):
        got = [np.asarray(w, dtype=np.int64)[:seq_len] for w in corpus][:windows]
    else:
        got = [w.input_ids for w in itertools.islice(iter_windows(corpus, tokenizer, seq_len), windows)]
    if len(got) < windows or any(len(w) < seq_len for w in got):
        raise BehaviorError(
            f"the corpus gave {len(got)} windows of {seq_len} tokens, {windows} were asked; "
            "ask for fewer windows or a shorter seq_len, or use a larger corpus"
        )
    return got


def _candidate_tokens(tokenizer, vocab_size: int) -> np.ndarray:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = np.arange(min(vocab_size, len(tokenizer)) if tokenizer is not None else vocab_size)
    return ids[~np.isin(ids, list(special))]


def plant_segments(
    input_ids: np.ndarray,
    distances: Sequence[int],
    seg_len: int,
    rng: np.random.Generator,
    candidates: np.ndarray,
    *,
    start: int = 1,
    max_tries: int = 1000,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plant one random segment pair per distance into one window, all pairs disjoint.

    Each pair ``j`` writes the same ``seg_len`` random token ids at
    ``first[j]`` and ``second[j] = first[j] + distances[j]``; the ids of all
    pairs are drawn without replacement from ``candidates`` (so no pair can
    prompt the continuation of another) and the ``2 * len(distances)``
    intervals never overlap. Positions are drawn uniformly and rejected until
    disjoint.

    Returns
    -------
    ids : numpy.ndarray
        The window with the segments written in, ``[seq]``.
    first, second : numpy.ndarray
        Start positions per distance, ``[distance]``.
    """
    seq = len(input_ids)
    d = np.asarray(distances, dtype=np.int64)  # [distance]
    if (d < seg_len).any():
        raise BehaviorError(f"every distance must be at least seg_len={seg_len} (segments would overlap), got {d.min()}")
    if start + d.max() + seg_len > seq:
        raise BehaviorError(
            f"distance {d.max()} + seg_len {seg_len} does not fit a {seq}-token window starting at {start}; "
            "use a longer seq_len or shorter distances"
        )
    if len(candidates) < len(d) * seg_len:
        raise BehaviorError(f"{len(candidates)} candidate tokens cannot fill {len(d)} segments of {seg_len}")
    for _ in range(max_tries):
        first = start + (rng.random(len(d)) * (seq - seg_len - d - start + 1)).astype(np.int64)  # [distance]
        starts = np.sort(np.concatenate([first, first + d]))
        if (np.diff(starts) >= seg_len).all():
            break
    else:
        raise BehaviorError(
            f"could not place {len(d)} disjoint segment pairs of {seg_len} tokens in {seq} tokens after {max_tries} "
            "draws; use fewer distances per window (together=False) or a longer seq_len"
        )
    segs = rng.choice(candidates, size=(len(d), seg_len), replace=False)  # [distance, seg]
    ids = np.array(input_ids, dtype=np.int64, copy=True)
    offsets = np.arange(seg_len)
    ids[first[:, None] + offsets] = segs
    ids[(first + d)[:, None] + offsets] = segs
    return ids, first, first + d


def token_scores(model, input_ids: torch.Tensor, positions: torch.Tensor, chunk_bytes: int = LOGITS_CHUNK_BYTES):
    """Negative log-likelihood and top-1 hit of the token at each ``positions`` given its prefix.

    The LM head runs on chunks of scored positions sized in bytes, not positions: a chunk's logits in the
    head's dtype, their float64 copy and its ``log_softmax`` stay within ``chunk_bytes``
    (:func:`qkplast.capture.plan.logits_chunk_rows`; a 4096-position chunk of a 151936-token vocabulary would
    be 5 GB of float64 alone). :func:`qkplast.capture.plan.plan_capture` counts the same chunk.

    Parameters
    ----------
    input_ids : torch.Tensor
        ``[batch, seq]`` token ids.
    positions : torch.Tensor
        ``[batch, n]`` positions (>= 1) of the predicted tokens.
    chunk_bytes : int
        Memory budget of one LM-head chunk (default :data:`qkplast.capture.plan.LOGITS_CHUNK_BYTES`).

    Returns
    -------
    nll, hit : torch.Tensor
        ``[batch, n]`` float64 NLL (nats) and bool top-1 correctness.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = model.get_output_embeddings()
    chunk = logits_chunk_rows(head.weight.shape[0], head.weight.element_size(), chunk_bytes)
    with torch.inference_mode():
        hidden = decoder(input_ids=input_ids, use_cache=False).last_hidden_state  # [batch, seq, hidden]
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None].expand_as(positions)  # [batch, n]
        h = hidden[rows, positions - 1]  # [batch, n, hidden]
        del hidden
        target = input_ids[rows, positions]  # [batch, n]
        flat_h, flat_t = h.reshape(-1, h.shape[-1]), target.reshape(-1)
        nll, hit = [], []
        for s in range(0, flat_h.shape[0], chunk):
            logits = head(flat_h[s: s + chunk]).double()  # [chunk, vocab]
            logp = torch.log_softmax(logits, -1)  # [chunk, vocab]
            nll.append(-logp.gather(1, flat_t[s: s + chunk, None])[:, 0])
            hit.append(logits.argmax(-1) == flat_t[s: s + chunk])
            del logits, logp
    return torch.cat(nll).reshape(positions.shape), torch.cat(hit).reshape(positions.shape)


def _device(model):
    return next(model.parameters()).device


def copy_by_distance(
    model,
    tokenizer,
    corpus: Corpus | Iterable[Document] | Sequence[np.ndarray],
    distances: Sequence[int],
    windows: int = 8,
    seq_len: int = 2048,
    seg_len: int = 24,
    seed: int = 0,
    *,
    together: bool = True,
    batch_size: int = 1,
) -> xr.Dataset:
    """Copy accuracy and NLL of a random segment repeated ``distance`` tokens later, per window.

    Parameters
    ----------
    model, tokenizer
        A causal LM (eval mode) and its tokenizer.
    corpus : Corpus, iterable of Document, or list of token-id arrays
        Real text the segments are planted into (cut with
        :func:`qkplast.capture.corpus.iter_windows`).
    distances : sequence of int
        Offsets between the two copies' starts; each at least ``seg_len``.
    windows, seq_len : int
        Number and length of the corpus windows.
    seg_len : int
        Segment length in tokens (the issue's 24).
    seed : int
        Seeds positions and segment tokens (``default_rng([seed, window])``).
    together : bool
        True: all distances planted in one window (disjoint pairs of distinct
        tokens), one forward per window. False: one forward per (window,
        distance), each with a single pair -- the cleaner but ``len(distances)``
        times slower design, kept to check that ``together`` does not bias
        the result.
    batch_size : int
        Sequences per forward.

    Returns
    -------
    xarray.Dataset
        ``nll`` (mean nats per scored token) and ``acc`` (top-1 share) with dims
        ``window, distance``; coords ``first``/``second`` (segment starts).
    """
    distances = [int(d) for d in distances]
    if not distances or len(set(distances)) != len(distances):
        raise BehaviorError(f"distances must be a non-empty list of distinct integers, got {distances}")
    if seg_len < 2:
        raise BehaviorError(f"seg_len must be at least 2 (the first token of a repeat is not scored), got {seg_len}")
    base = token_windows(corpus, tokenizer, seq_len, windows)
    vocab = int(model.config.get_text_config().vocab_size)
    candidates = _candidate_tokens(tokenizer, vocab)
    seqs, firsts, seconds, slots = [], [], [], []  # slots: (window, distance indices) per sequence
    groups = [list(range(len(distances)))] if together else [[j] for j in range(len(distances))]
    for w, ids in enumerate(base):
        rng = np.random.default_rng([seed, w])
        for group in groups:
            planted, first, second = plant_segments(ids, [distances[j] for j in group], seg_len, rng, candidates)
            seqs.append(planted)
            firsts.append(first)
            seconds.append(second)
            slots.append((w, group))
    nll = np.full((len(base), len(distances)), np.nan)
    acc = np.full((len(base), len(distances)), np.nan)
    first_pos = np.zeros((len(base), len(distances)), np.int64)
    second_pos = np.zeros((len(base), len(distances)), np.int64)
    dev = _device(model)
    offsets = np.arange(1, seg_len)
    for s in range(0, len(seqs), batch_size):
        chunk = range(s, min(s + batch_size, len(seqs)))
        ids = torch.as_tensor(np.stack([seqs[i] for i in chunk]), device=dev)  # [batch, seq]
        pos = torch.as_tensor(np.stack([(seconds[i][:, None] + offsets).ravel() for i in chunk]), device=dev)
        tok_nll, tok_hit = token_scores(model, ids, pos)  # [batch, group * (seg-1)]
        for b, i in enumerate(chunk):
            w, group = slots[i]
            nll[w, group] = tok_nll[b].reshape(len(group), -1).mean(-1).cpu().numpy()
            acc[w, group] = tok_hit[b].reshape(len(group), -1).double().mean(-1).cpu().numpy()
            first_pos[w, group], second_pos[w, group] = firsts[i], seconds[i]
    return xr.Dataset(
        {"nll": (("window", "distance"), nll), "acc": (("window", "distance"), acc)},
        coords={"window": np.arange(len(base)), "distance": distances,
                "first": (("window", "distance"), first_pos), "second": (("window", "distance"), second_pos)},
        attrs={"seq_len": seq_len, "seg_len": seg_len, "seed": seed, "together": int(together),
               "scored_tokens": seg_len - 1,
               "method": "random segment planted twice into real windows; tokens 2..seg_len of the repeat scored"},
    )


def loss_by_position(
    model,
    tokenizer,
    corpus: Corpus | Iterable[Document] | Sequence[np.ndarray],
    windows: int = 8,
    seq_len: int = 2048,
    *,
    batch_size: int = 1,
) -> xr.Dataset:
    """Next-token NLL and top-1 hit at every position of the corpus windows.

    Returns
    -------
    xarray.Dataset
        ``nll`` and ``hit`` with dims ``window, position``; ``position`` is the
        index of the predicted token (1..seq_len-1).
    """
    base = token_windows(corpus, tokenizer, seq_len, windows)
    dev = _device(model)
    pos = torch.arange(1, seq_len, device=dev)  # [position]
    nll, hit = [], []
    for s in range(0, len(base), batch_size):
        ids = torch.as_tensor(np.stack(base[s: s + batch_size]), device=dev)  # [batch, seq]
        n, h = token_scores(model, ids, pos.expand(ids.shape[0], -1))
        nll.append(n.cpu().numpy())
        hit.append(h.cpu().numpy())
    return xr.Dataset(
        {"nll": (("window", "position"), np.concatenate(nll)), "hit": (("window", "position"), np.concatenate(hit))},
        coords={"window": np.arange(len(base)), "position": np.arange(1, seq_len)},
        attrs={"seq_len": seq_len},
    )


PASSKEY_NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
PASSKEY_QUESTION = " What is the pass key? The pass key is"


def passkey_by_depth(
    model,
    tokenizer,
    corpus: Corpus | Iterable[Document] | Sequence[np.ndarray],
    depths: Sequence[float],
    windows: int = 8,
    seq_len: int = 2048,
    digits: int = 5,
    seed: int = 0,
    *,
    batch_size: int = 1,
) -> xr.Dataset:
    """Prompted passkey retrieval with the key at relative ``depths`` of real corpus filler.

    The prompt is ``filler[:p] + needle + filler[p:] + question + key`` cut to
    ``seq_len`` tokens, the needle stating a random ``digits``-digit key twice;
    ``p`` puts the needle's start at ``depth`` of the filler.

    Returns
    -------
    xarray.Dataset
        ``acc`` (1 if every key token is the top-1 prediction given the ones
        before it, i.e. greedy decoding returns the key), ``logp`` (summed
        log-probability of the key tokens, nats) and ``distance`` (tokens from
        the needle's start to the first key token), dims ``window, depth``.
    """
    depths = [float(x) for x in depths]
    if not depths or any(not 0 <= x <= 1 for x in depths):
        raise BehaviorError(f"depths must be fractions in [0, 1], got {depths}")
    if digits < 1:
        raise BehaviorError(f"digits must be positive, got {digits}")
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    question = enc(PASSKEY_QUESTION)
    base = token_windows(corpus, tokenizer, seq_len, windows)
    rows, key_pos, dist = [], [], []
    for w, filler in enumerate(base):
        rng = np.random.default_rng([seed, w])
        key = "".join(str(x) for x in rng.integers(0, 10, digits))
        key = str(rng.integers(1, 10)) + key[1:]  # no leading zero
        needle, answer = enc(PASSKEY_NEEDLE.format(key=key)), enc(" " + key)
        room = seq_len - len(needle) - len(question) - len(answer)
        if room < 1:
            raise BehaviorError(f"seq_len {seq_len} leaves no room for filler around the passkey prompt; raise seq_len")
        body = list(filler[:room])
        for depth in depths:
            p = int(round(depth * room))
            ids = body[:p] + needle + body[p:] + question + answer
            rows.append(np.asarray(ids, dtype=np.int64))
            key_pos.append(np.arange(seq_len - len(answer), seq_len))
            dist.append(seq_len - len(answer) - p)
    dev = _device(model)
    n_ans = len(key_pos[0])
    if any(len(k) != n_ans for k in key_pos):
        raise BehaviorError("keys tokenised to different lengths; the tokenizer does not split digits uniformly")
    logp, acc = [], []
    for s in range(0, len(rows), batch_size):
        ids = torch.as_tensor(np.stack(rows[s: s + batch_size]), device=dev)  # [batch, seq]
        pos = torch.as_tensor(np.stack(key_pos[s: s + batch_size]), device=dev)  # [batch, answer]
        n, h = token_scores(model, ids, pos)
        logp.append(-n.sum(-1).cpu().numpy())
        acc.append(h.all(-1).double().cpu().numpy())
    shape = (len(base), len(depths))
    return xr.Dataset(
        {"acc": (("window", "depth"), np.concatenate(acc).reshape(shape)),
         "logp": (("window", "depth"), np.concatenate(logp).reshape(shape)),
         "distance": (("window", "depth"), np.asarray(dist).reshape(shape))},
        coords={"window": np.arange(len(base)), "depth": depths},
        attrs={"seq_len": seq_len, "digits": digits, "seed": seed, "needle": PASSKEY_NEEDLE,
               "question": PASSKEY_QUESTION},
    )


# --------------------------------------------------------------------------- copying at set positions and distances


@dataclass(frozen=True)
class CopyDesign:
    """Where the two copies of each planted segment sit: every (second-copy position, distance) cell.

    The second copy starts at one of ``positions`` and the first copy ``distance`` tokens earlier, for every
    combination; so the effect of distance can be read with the second copy's absolute position held fixed,
    and the effect of position with the distance held fixed. A forward pass cannot hold two second copies
    at one position, so the cells are spread over ``len(distances)`` sequences per window in a Latin
    arrangement (sequence ``s`` pairs position ``i`` with distance ``(i + s) mod n``); sequence 0 holds one
    cell per position, the cells a cheaper measurement (the null head sets of the interventions) reads.

    With ``matched_context`` the near and far cells of a position share their local context: every sequence
    plants, at every position ``p``, a span at ``p - d`` for *every* distance ``d`` of the design; the span at the
    cell's distance holds the first copy and the others hold distinct random distractor segments, drawn once per
    window. Two cells of one position then differ only in which of those spans holds the first copy (and, in
    the other positions of the sequences, likewise), not in the text around the second copy.

    Attributes
    ----------
    window : int
        Tokens per window (one window per document).
    seg_len : int
        Tokens per copy; tokens 2..``seg_len`` of the second copy are scored.
    positions, distances : tuple of int
        Start of the second copy, and offsets from the first copy's start to it; at most as many positions
        as distances.
    matched_context : bool
        Plant a span at every distance at every position (see above); False: only the cells' copies.
    """

    window: int = 512
    seg_len: int = 16
    positions: tuple = (288, 480)
    distances: tuple = (32, 256)
    matched_context: bool = False

    def __post_init__(self):
        object.__setattr__(self, "positions", tuple(int(p) for p in self.positions))
        object.__setattr__(self, "distances", tuple(int(d) for d in self.distances))
        self.check()

    def sequences(self) -> list[list[tuple[int, int]]]:
        """The (position, distance) cells of each sequence."""
        n = len(self.distances)
        return [[(p, self.distances[(i + s) % n]) for i, p in enumerate(self.positions)] for s in range(n)]

    @property
    def cells(self) -> list[tuple[int, int]]:
        return [(p, d) for p in self.positions for d in self.distances]

    def spans(self, s: int) -> list[int]:
        """Start of every planted span of sequence ``s``: the second copies, and the first copies (with
        ``matched_context``, a span at every distance before every position)."""
        if self.matched_context:
            return sorted(x for p in self.positions for x in (p, *(p - d for d in self.distances)))
        return sorted(x for p, d in self.sequences()[s] for x in (p - d, p))

    def planted(self, base: np.ndarray, rng: np.random.Generator, candidates: np.ndarray, s: int) -> np.ndarray:
        """``base`` (one window's tokens) with sequence ``s``'s segments written in.

        Plain design: one random segment per cell of the sequence, distinct across its cells, drawn from
        ``rng`` (seeded per window and sequence by :func:`copy_cells`). ``matched_context``: the segments of
        the whole window are drawn once from ``rng`` (seeded per window): position ``i``'s segment ``S_i`` and
        a distractor ``D_ij`` for every distance ``j``; the span ``p_i - d_j`` holds ``S_i`` at the cell's
        distance and ``D_ij`` elsewhere, so the sequences of one window differ only inside those spans.
        """
        ids = np.array(base[: self.window], dtype=np.int64, copy=True)
        offsets = np.arange(self.seg_len)
        cells = self.sequences()[s]
        if not self.matched_context:
            segs = rng.choice(candidates, size=(len(cells), self.seg_len), replace=False)  # [pair, seg]
            for (p, d), seg in zip(cells, segs):
                ids[p - d + offsets], ids[p + offsets] = seg, seg
            return ids
        n_pos, n_dist = len(self.positions), len(self.distances)
        segs = rng.choice(candidates, size=(n_pos * (1 + n_dist), self.seg_len), replace=False)  # [segment, seg]
        for i, (p, d_cell) in enumerate(cells):
            ids[p + offsets] = segs[i]
            for j, d in enumerate(self.distances):
                ids[p - d + offsets] = segs[i] if d == d_cell else segs[n_pos + i * n_dist + j]
        return ids

    def n_segments(self) -> int:
        """Distinct random segments one planted sequence needs."""
        if self.matched_context:
            return len(self.positions) * (1 + len(self.distances))
        return max(len(seq) for seq in self.sequences())

    def check(self) -> None:
        """Every copy inside the window (the first from token 1 on), no two copies of a sequence overlapping."""
        if self.seg_len < 2:
            raise BehaviorError(f"seg_len must be at least 2 (the first token of a repeat is not scored), got {self.seg_len}")
        if not self.positions or len(set(self.positions)) != len(self.positions) or len(set(self.distances)) != len(self.distances):
            raise BehaviorError(f"positions and distances must be non-empty lists of distinct integers, got "
                                f"{list(self.positions)} and {list(self.distances)}")
        if len(self.positions) > len(self.distances):
            raise BehaviorError(f"{len(self.positions)} positions need at least as many distances, got "
                                f"{len(self.distances)}: add distances or drop positions")
        for s, seq in enumerate(self.sequences()):
            spans = self.spans(s)
            if spans[0] < 1 or max(p for p, _ in seq) + self.seg_len > self.window:
                raise BehaviorError(f"the cells {seq} put a copy outside tokens 1..{self.window - 1} of a "
                                    f"{self.window}-token window; use later positions, shorter distances or a longer window")
            if any(b - a < self.seg_len for a, b in zip(spans, spans[1:])):
                raise BehaviorError(f"the cells {seq} overlap (copies of {self.seg_len} tokens at {spans}); spread the "
                                    "positions or distances further apart"
                                    + (" (matched_context plants every distance at every position)"
                                       if self.matched_context else ""))


def document_windows(corpus, tokenizer, length: int, n: int, *, skip: int = 0) -> tuple[list[np.ndarray], list[str]]:
    """One window of ``length`` tokens per document: windows ``skip .. skip + n - 1`` of the corpus's documents
    long enough for one (``short_docs="skip"``, so a window never mixes documents), and their ids.

    The documents a capture with ``short_docs="skip"`` and ``docs=skip`` reads are exactly the ones skipped,
    so the behaviour can be measured on documents the geometry was not.
    """
    got = list(itertools.islice(iter_windows(corpus, tokenizer, length, short_docs="skip"), skip, skip + n))
    if len(got) < n:
        raise BehaviorError(f"the corpus has {len(got) + skip} documents of at least {length} tokens; {skip} are "
                            f"set aside and {n} were asked for the behaviour: ask for fewer windows or a shorter window")
    return [np.asarray(w.input_ids, dtype=np.int64) for w in got], [w.doc_id for w in got]


def copy_cells(model, tokenizer, windows: Sequence[np.ndarray], design: CopyDesign, seed: int = 0, *,
               sequences: Sequence[int] | None = None, n_windows: int | None = None, batch_size: int = 1) -> xr.Dataset:
    """NLL and accuracy of the repeated segment in every cell of ``design``, per window.

    Each sequence of the design plants its segments (:meth:`CopyDesign.planted`: random token ids, distinct
    across the sequence's pairs, drawn with ``default_rng([seed, window, sequence])``, or once per window with
    ``default_rng([seed, window])`` under ``matched_context``, so every condition of an experiment sees the same
    windows and segments) and is scored in one forward pass: tokens 2..``seg_len`` of each second
    copy, mean NLL (nats per token) and top-1 accuracy.

    Parameters
    ----------
    sequences : sequence of int, optional
        The design's sequences to run (default all); cells of the others are NaN.
    n_windows : int, optional
        Run only the first ``n_windows`` windows (default all); the others' cells are NaN. A window's segments
        do not depend on how many windows run, so its cells are the ones a run of every window gives.

    Returns
    -------
    xarray.Dataset
        ``nll``, ``acc`` with dims ``window, position, distance``.
    """
    design.check()
    for w in windows:
        if len(w) < design.window:
            raise BehaviorError(f"a window has {len(w)} tokens, the design needs {design.window}")
    plan = design.sequences()
    run = list(range(len(plan))) if sequences is None else [int(s) for s in sequences]
    vocab = int(model.config.get_text_config().vocab_size)
    candidates = _candidate_tokens(tokenizer, vocab)
    n_pairs = design.n_segments()
    if len(candidates) < n_pairs * design.seg_len:
        raise BehaviorError(f"{len(candidates)} candidate tokens cannot fill {n_pairs} segments of {design.seg_len}")
    shape = (len(windows), len(design.positions), len(design.distances))
    nll, acc = np.full(shape, np.nan), np.full(shape, np.nan)
    jobs = []  # (window, sequence, ids, second-copy starts)
    for w, base in enumerate(windows[:n_windows]):
        for s in run:
            # matched context: one draw per window, so every sequence of the window plants the same segments
            rng = np.random.default_rng([seed, w] if design.matched_context else [seed, w, s])
            jobs.append((w, s, design.planted(base, rng, candidates, s)))
    dev = _device(model)
    scored = np.arange(1, design.seg_len)
    pi = {p: i for i, p in enumerate(design.positions)}
    di = {d: i for i, d in enumerate(design.distances)}
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start: start + batch_size]
        ids = torch.as_tensor(np.stack([j[2] for j in chunk]), device=dev)  # [batch, seq]
        pos = torch.as_tensor(np.stack([(np.array([p for p, _ in plan[j[1]]])[:, None] + scored).ravel()
                                        for j in chunk]), device=dev)  # [batch, pair * (seg - 1)]
        tok_nll, tok_hit = token_scores(model, ids, pos)
        for b, (w, s, _) in enumerate(chunk):
            per = tok_nll[b].reshape(len(plan[s]), -1).mean(-1).cpu().numpy()
            hit = tok_hit[b].reshape(len(plan[s]), -1).double().mean(-1).cpu().numpy()
            for (p, d), v, a in zip(plan[s], per, hit):
                nll[w, pi[p], di[d]], acc[w, pi[p], di[d]] = v, a
    dims = ("window", "position", "distance")
    return xr.Dataset(
        {"nll": (dims, nll), "acc": (dims, acc)},
        coords={"window": np.arange(len(windows)), "position": list(design.positions),
                "distance": list(design.distances)},
        attrs={"window_tokens": design.window, "seg_len": design.seg_len, "seed": seed, "scored_tokens": design.seg_len - 1,
               "sequences": run, "matched_context": int(design.matched_context),
               "method": "random segments planted twice at set second-copy positions and distances; tokens "
                         "2..seg_len of each second copy scored (mean NLL in nats per token, top-1 accuracy)"},
    )
