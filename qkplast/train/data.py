"""The training data: documents split into training and held-out, tokenized once, cut into windows.

Made once per training directory (``DIR/data/``, ``DIR/tokenizer/``) before any model is trained:

* ``stream.npy``: the training documents' tokens, packed, each document followed by ``<|endoftext|>``; stage A
  cuts it into windows of ``window`` tokens;
* ``chunks.npy`` ``[chunk, ext_window]``: consecutive, non-overlapping windows of the training documents that
  hold at least ``ext_window`` tokens, each inside one document (the extension's long-context data);
* ``heldout.jsonl``: the held-out documents of at least ``ext_window`` tokens, a corpus for
  :func:`qkplast.capture.corpus.open_corpus` (the captures); ``heldout.npy`` ``[doc, ext_window]`` their first
  windows;
* ``heldout_stream.npy`` ``[window, ext_window]``: every held-out document packed as stage A packs the training
  documents, cut into windows: the evaluation windows, whose positions are not tied to the start of a document
  (a document's first tokens, titles and labels, are easier or harder than its body for reasons that have
  nothing to do with context).

A ``+``-joined corpus (``python-docs+stdlib-code``) is a mix: each corpus is split into training and held-out
documents on its own (:func:`split_documents`), then the training parts and the held-out parts are concatenated
in the order the mix names them; every file above carries the documents of every corpus.

Which step sees which windows, and which of them carry a copied span (:func:`copy_windows`, ``copy_share``), is
a pure function of the seed and the step (:func:`batch_windows`, :func:`copy_batch`), so a resumed training reads
exactly the batches it would have read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qkplast.capture.corpus import Document, open_corpus
from qkplast.errors import QkplastError
from qkplast.train.config import TrainConfig, corpus_parts
from qkplast.train.tokenizer import EOT, train_tokenizer

__all__ = ["COPY_EVAL_STREAM", "TokenData", "batch_windows", "copy_batch", "copy_windows", "heldout_copy_windows",
           "load_data", "mixed_documents", "ngram_baselines", "prepare_data", "split_documents", "with_bos"]

#: Random streams of a seed (the second entry of every ``numpy`` seed sequence here): the batches of stage A (0)
#: and of the extension (1), the copied spans of stage A (2) and of the extension (3), and the copied spans of
#: the held-out evaluation windows (4, :func:`heldout_copy_windows`), never drawn by a training step.
COPY_STREAMS = {"stageA": 2, "extension": 3}
COPY_EVAL_STREAM = 4


class DataError(QkplastError):
    """The corpus cannot give the windows a training needs."""


@dataclass
class TokenData:
    """The arrays of ``DIR/data`` (memory-mapped)."""

    stream: np.ndarray  # [token] packed training documents
    chunks: np.ndarray  # [chunk, ext_window] single-document windows
    heldout: np.ndarray  # [doc, ext_window] first windows of the held-out documents
    heldout_stream: np.ndarray  # [window, ext_window] the held-out documents packed and cut
    eot: int

    def windows(self, length: int) -> np.ndarray:
        """The packed stream as ``[window, length]`` (the tail that does not fill a window dropped)."""
        n = len(self.stream) // length
        return self.stream[: n * length].reshape(n, length)


def split_documents(documents, heldout_every: int) -> tuple[list, list]:
    """(training, held-out): the ``heldout_every``-th, ``2 heldout_every``-th, ... documents are held out."""
    train, held = [], []
    for i, doc in enumerate(documents, 1):
        (held if i % heldout_every == 0 else train).append(doc)
    return train, held


def mixed_documents(config: TrainConfig) -> tuple[list, list, dict]:
    """(training, held-out, {corpus: [documents, training, held-out]}) of ``config.corpus``.

    Each corpus of a ``+`` mix is cut to its first ``max_docs`` documents and split on its own, so each
    contributes its share of held-out documents; the parts follow the mix's order. In a mix a document's id is
    ``corpus:id`` (two corpora may use the same ids).
    """
    import itertools

    parts = corpus_parts(config.corpus)
    train, held, counts = [], [], {}
    for part in parts:
        documents = list(itertools.islice(open_corpus(part), config.max_docs))
        if len(parts) > 1:
            documents = [Document(f"{part}:{d.id}", d.text) for d in documents]
        t, h = split_documents(documents, config.heldout_every)
        train, held, counts[part] = train + t, held + h, [len(documents), len(t), len(h)]
    return train, held, counts


def prepare_data(config: TrainConfig, out: Path, progress: bool = True) -> None:
    """Train the tokenizer on the training documents and write ``DIR/tokenizer`` and ``DIR/data`` (once)."""
    data = Path(out) / "data"
    if (data / "done.json").exists():
        return
    train, held, counts = mixed_documents(config)
    documents = train + held
    if progress:
        print(f"[train] tokenizer: byte-level BPE of {config.vocab_size} tokens on {len(train)} documents "
              f"({len(held)} held out)", flush=True)
    tokenizer = train_tokenizer((d.text for d in train), config.vocab_size)
    eot = tokenizer.convert_tokens_to_ids(EOT)
    encode = tokenizer.backend_tokenizer.encode_batch
    train_ids = [np.asarray(e.ids, np.int32) for e in encode([d.text for d in train])]
    held_ids = [np.asarray(e.ids, np.int32) for e in encode([d.text for d in held])]
    L = config.ext_window
    stream = np.concatenate([np.append(ids, eot) for ids in train_ids])
    chunks = [ids[: len(ids) // L * L].reshape(-1, L) for ids in train_ids if len(ids) >= L]
    long_held = [(d, ids) for d, ids in zip(held, held_ids) if len(ids) >= L]
    if not chunks or len(long_held) < 2:
        raise DataError(f"corpus {config.corpus!r} ({len(documents)} documents) has too few documents of "
                        f"{L} tokens (training: {len(chunks)}, held out: {len(long_held)}); raise max_docs or "
                        "lower window/ext_factor")
    data.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(Path(out) / "tokenizer")
    np.save(data / "stream.npy", stream)
    np.save(data / "chunks.npy", np.concatenate(chunks))
    np.save(data / "heldout.npy", np.stack([ids[:L] for _, ids in long_held]))
    held_stream = np.concatenate([np.append(ids, eot) for ids in held_ids])
    np.save(data / "heldout_stream.npy", held_stream[: len(held_stream) // L * L].reshape(-1, L))
    with open(data / "heldout.jsonl", "w") as f:
        for doc, _ in long_held:
            f.write(json.dumps({"id": doc.id, "text": doc.text}) + "\n")
    summary = {"documents": len(documents), "train_documents": len(train), "heldout_documents": len(held),
               "train_tokens": int(len(stream)), "chunks": int(sum(len(c) for c in chunks)),
               "heldout_windows": len(long_held), "eot": int(eot)}
    if len(counts) > 1:
        summary["corpora"] = {part: dict(zip(("documents", "train_documents", "heldout_documents"), n))
                              for part, n in counts.items()}
    (data / "done.json").write_text(json.dumps(summary, indent=1))


def load_data(out: Path) -> TokenData:
    data = Path(out) / "data"
    eot = json.loads((data / "done.json").read_text())["eot"]
    load = lambda name: np.load(data / name, mmap_mode="r")  # noqa: E731
    return TokenData(load("stream.npy"), load("chunks.npy"), load("heldout.npy"), load("heldout_stream.npy"), int(eot))


def batch_windows(n_windows: int, per_step: int, step: int, seed: int, stream: int) -> np.ndarray:
    """Indices of the windows of ``step``: epochs of a permutation seeded by ``(seed, stream)``.

    A pure function of its arguments (the permutation of each epoch is drawn from its own seed), so resuming
    at any step reads the same batches. ``stream`` 0 is stage A, 1 the extension (every arm reads the same).
    """
    start, stop = step * per_step, (step + 1) * per_step
    out = []
    for epoch in range(start // n_windows, (stop - 1) // n_windows + 1):
        order = np.random.default_rng([seed, stream, epoch]).permutation(n_windows)
        lo, hi = max(start - epoch * n_windows, 0), min(stop - epoch * n_windows, n_windows)
        out.append(order[lo:hi])
    return np.concatenate(out)


def copy_windows(windows, n: int, copy_len: int, rng: np.random.Generator, *, vocab_size: int,
                 eot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` of ``windows`` (drawn by ``rng``) with a span of random tokens written twice at a random distance.

    For each chosen window of W tokens: a distance ``d`` uniform in ``[copy_len, W - copy_len]``, a first start
    ``s`` uniform in ``[0, W - copy_len - d]``, and ``copy_len`` tokens uniform over the ``vocab_size`` ids but
    ``eot``, written at ``s`` and again at ``s + d`` (the copies never overlap; the distance is never fixed, so
    the only way to predict the second copy is to find the first: copying, not a positional shortcut).

    Parameters
    ----------
    windows : array ``[rows, W]`` of token ids
        Left unchanged (the result is a copy).
    n : int
        How many rows carry a span, ``0 <= n <= rows``.
    copy_len : int
        Tokens of the span, ``2 copy_len <= W``.
    rng : numpy.random.Generator
        Every draw comes from it, in a fixed order: the same generator state gives the same result.
    vocab_size, eot : int
        The ids the span is drawn from, ``[0, vocab_size)`` less ``eot``.

    Returns
    -------
    (windows, first_start, second_start)
        The windows ``[rows, W]`` (int64) and, per row, where the span and its copy start (-1 in rows without).
    """
    out = np.array(windows, dtype=np.int64, copy=True)  # [rows, W]
    rows, width = out.shape
    if not 0 <= n <= rows or 2 * copy_len > width:
        raise ValueError(f"copy_windows: n={n} of {rows} rows, copy_len={copy_len} for windows of {width} tokens")
    first, second = np.full(rows, -1, np.int64), np.full(rows, -1, np.int64)
    chosen = np.sort(rng.choice(rows, size=n, replace=False))
    distance = rng.integers(copy_len, width - copy_len, size=n, endpoint=True)
    start = rng.integers(0, width - copy_len - distance, endpoint=True)  # [n], each within its own bound
    span = rng.integers(0, vocab_size - 1, size=(n, copy_len))
    span += span >= eot  # skip the end-of-text id: uniform over the others
    offsets = np.arange(copy_len)
    out[chosen[:, None], start[:, None] + offsets] = span
    out[chosen[:, None], (start + distance)[:, None] + offsets] = span
    first[chosen], second[chosen] = start, start + distance
    return out, first, second


def copy_batch(config: TrainConfig, windows, seed: int, step: int, stream: str, eot: int) -> np.ndarray:
    """The windows of a training step with ``copy_share`` of them (binomially, drawn from ``(seed, stream, step)``)
    carrying a copied span (:func:`copy_windows`); ``stream`` is ``stageA`` or ``extension``."""
    if config.copy_share == 0:
        return np.asarray(windows, np.int64)
    rng = np.random.default_rng([seed, COPY_STREAMS[stream], step])
    n = int(rng.binomial(len(windows), config.copy_share))
    return copy_windows(windows, n, config.copy_len, rng, vocab_size=config.vocab_size, eot=eot)[0]


def heldout_copy_windows(data: TokenData, length: int, count: int, copy_len: int, vocab_size: int,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``count`` held-out evaluation windows of ``length`` tokens, each carrying a copied span.

    The evaluation windows (``heldout_stream`` cut to ``length``, which divides the extension window) with
    :func:`copy_windows` drawn from stream :data:`COPY_EVAL_STREAM` of ``seed``: held-out text around spans no
    training step drew. Returns ``(windows, first_start, second_start)`` as :func:`copy_windows` does.
    """
    windows = np.asarray(data.heldout_stream, np.int64).reshape(-1, length)[:count]
    rng = np.random.default_rng([seed, COPY_EVAL_STREAM])
    return copy_windows(windows, len(windows), copy_len, rng, vocab_size=vocab_size, eot=data.eot)


def ngram_baselines(data: TokenData, vocab_size: int, ks=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0)) -> dict[str, float]:
    """Unigram and bigram entropies of the training tokens, in nats per token.

    ``unigram``, ``bigram``: cross-entropies on the held-out evaluation windows of a unigram model (add-one counts) and of a
    bigram model interpolated with it, ``p(b | a) = (c(a, b) + k p(b)) / (c(a) + k)``, with the ``k`` of ``ks``
    that fits the held-out windows best (the strongest baseline of the family). ``unigram_plugin``,
    ``bigram_plugin``: the plug-in entropies ``H(X)`` and ``H(X_t | X_{t-1})`` of the training stream itself
    (biased low: they score the counts on the tokens they were counted on).
    """
    V = vocab_size
    s = np.asarray(data.stream, np.int64)
    uni = np.bincount(s, minlength=V).astype(np.float64)  # [V]
    pair = np.bincount(s[:-1] * V + s[1:], minlength=V * V).astype(np.float64)  # [V*V]
    p_uni = (uni + 1) / (uni.sum() + V)
    h = np.asarray(data.heldout_stream, np.int64)  # [window, L]
    a, b = h[:, :-1].ravel(), h[:, 1:].ravel()
    c_ab, c_a = pair[a * V + b], pair.reshape(V, V).sum(1)[a]
    bigram = min(float(-np.mean(np.log((c_ab + k * p_uni[b]) / (c_a + k)))) for k in ks)
    p = uni / uni.sum()
    nz = pair[pair > 0]
    joint = nz / nz.sum()
    h_joint = float(-(joint * np.log(joint)).sum())
    prev = np.bincount(s[:-1], minlength=V).astype(np.float64)
    prev = prev[prev > 0] / prev.sum()
    return {"unigram": float(-np.mean(np.log(p_uni[h[:, 1:].ravel()]))), "bigram": bigram,
            "unigram_plugin": float(-(p[p > 0] * np.log(p[p > 0])).sum()),
            "bigram_plugin": h_joint + float((prev * np.log(prev)).sum())}


def with_bos(windows: np.ndarray, bos: bool, eot: int) -> np.ndarray:
    """``windows`` ``[n, W]`` with ``<|endoftext|>`` in place of each first token when ``bos`` (a copy; else as
    they are): every window then starts as a hub model's documents start, with the token that begins a document."""
    if not bos:
        return windows
    out = np.array(windows, np.int64)  # [n, W]
    out[:, 0] = eot
    return out
