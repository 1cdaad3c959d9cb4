"""Offline corpora and the cutting of documents into seq_len-token windows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qkplast.capture.corpus import (CorpusError, Document, WindowStats, count_windows, iter_windows, open_corpus,
                                    prefix_tokens, token_lengths, windows_of_lengths)
from tests.helpers import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_pydoc_topics_is_sorted_prose():
    from pydoc_data.topics import topics

    docs = list(open_corpus("pydoc-topics"))
    assert [d.id for d in docs] == sorted(topics)
    assert docs[0].text == topics[docs[0].id]
    assert list(open_corpus("pydoc-topics")) == docs  # re-iterable, same order


def test_stdlib_code_is_the_standard_library_in_path_order():
    corpus = open_corpus("stdlib-code")
    ids = [d.id for d in _first(corpus, 3000)]
    assert ids == sorted(ids)
    assert "json/decoder.py" in ids and "os.py" in ids
    assert not any(part in ("test", "tests", "idle_test", "site-packages") for i in ids for part in i.split("/")[:-1])
    first = next(iter(corpus))
    assert first.text.strip()
    assert corpus.details["kind"] == "named" and corpus.details["name"] == "stdlib-code"


def _first(corpus, n):
    out = []
    for doc in corpus:
        out.append(doc)
        if len(out) == n:
            break
    return out


def test_text_files_and_directories(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "b" / "c.txt").write_text("second")
    (tmp_path / "ignored.md").write_text("not a corpus file")
    docs = list(open_corpus(str(tmp_path)))
    assert docs == [Document("a.txt", "first"), Document("b/c.txt", "second")]
    assert list(open_corpus(str(tmp_path / "a.txt"))) == [Document("a.txt", "first")]
    with pytest.raises(CorpusError, match="must end in .txt or .jsonl"):
        open_corpus(str(tmp_path / "ignored.md"))


def test_jsonl_fields_and_ids(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"id": "  LBP/ä #1 ", "text": "alpha"}, {"text": "beta"}, {"id": 7, "text": "gamma"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert list(open_corpus(str(path))) == [
        Document("  LBP/ä #1 ", "alpha"),  # kept exactly as given
        Document("docs.jsonl:2", "beta"),
        Document("7", "gamma"),
    ]
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"_id": "x", "context": "long text"}))
    assert list(open_corpus(str(other), text_field="context", id_field="_id")) == [Document("x", "long text")]
    with pytest.raises(CorpusError, match="no text field 'text'.*--text-field"):
        list(open_corpus(str(other)))
    other.write_text("{not json")
    with pytest.raises(CorpusError, match="other.jsonl:1: not valid JSON"):
        list(open_corpus(str(other)))


def test_unknown_and_empty_corpora(tmp_path):
    with pytest.raises(CorpusError, match="unknown corpus 'nope'.*pydoc-topics, stdlib-code"):
        open_corpus("nope")
    with pytest.raises(CorpusError, match="holds no .txt or .jsonl files"):
        open_corpus(str(tmp_path))
    with pytest.raises(CorpusError, match="expected hf:<name>"):
        open_corpus("hf:")


def test_hugging_face_loader_on_a_local_dataset(tmp_path, monkeypatch):
    pytest.importorskip("datasets", reason="the optional 'datasets' package is not installed")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "longbench-like"
    data.mkdir()
    rows = [{"_id": f"lbp-{i:03d}", "context": f"document number {i} " * 5, "question": "?"} for i in range(4)]
    (data / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    corpus = open_corpus(f"hf:{data}:test", text_field="context", id_field="_id")
    docs = list(corpus)
    assert [d.id for d in docs] == [r["_id"] for r in rows]
    assert docs[2].text == rows[2]["context"]
    assert corpus.details == {
        "kind": "hf",
        "name": str(data),
        "split": "test",
        "text_field": "context",
        "id_field": "_id",
    }
    with pytest.raises(CorpusError, match="no text column 'text'"):
        list(open_corpus(f"hf:{data}:test"))
    with pytest.raises(CorpusError, match="cannot load Hugging Face dataset"):
        list(open_corpus(f"hf:{data}:nosplit"))


def test_long_documents_are_truncated_with_their_id(tokenizer):
    text = "for x in range(10): print(x)\n" * 40
    stats = WindowStats()
    windows = list(iter_windows([Document("long", text)], tokenizer, 32, stats=stats))
    assert len(windows) == 1 and windows[0].doc_id == "long" and windows[0].parts == ("long",)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    np.testing.assert_array_equal(windows[0].input_ids, ids[:32])
    assert windows[0].input_ids.dtype == np.int64
    assert stats.windows == 1 and stats.documents_read == 1


def test_short_documents_are_concatenated_with_eos(tokenizer):
    docs = [
        Document("a", "one two three"),
        Document("", "   "),
        Document("b", "four five six"),
        Document("long", "x " * 50),
        Document("c", "seven eight nine ten"),
    ]
    enc = {d.id: tokenizer(d.text, add_special_tokens=False)["input_ids"] for d in docs}
    seq_len = 24
    assert len(enc["a"]) + 1 + len(enc["b"]) < seq_len < len(enc["a"]) + len(enc["b"]) + len(enc["c"]) + 2
    assert len(enc["long"]) >= seq_len
    stats = WindowStats()
    windows = list(iter_windows(docs, tokenizer, seq_len, stats=stats))
    # The long document is a window of its own; the short ones around it are joined in corpus order.
    assert [w.doc_id for w in windows] == ["long", "a+b+c"]
    joined = windows[1]
    eos = tokenizer.eos_token_id
    np.testing.assert_array_equal(joined.input_ids, (enc["a"] + [eos] + enc["b"] + [eos] + enc["c"])[:seq_len])
    assert joined.parts == ("a", "b", "c")
    assert stats.empty_documents_skipped == 1 and stats.concatenated_windows == 1 and stats.windows == 2


def test_skip_policy_counts_short_documents(tokenizer):
    docs = [Document("a", "short"), Document("b", "word " * 40), Document("c", "also short")]
    stats = WindowStats()
    windows = list(iter_windows(docs, tokenizer, 16, short_docs="skip", stats=stats))
    assert [w.doc_id for w in windows] == ["b"]
    assert stats.short_documents_skipped == 2 and stats.windows == 1
    with pytest.raises(CorpusError, match="short_docs must be one of"):
        list(iter_windows(docs, tokenizer, 16, short_docs="pad"))


def test_leftover_short_documents_are_counted(tokenizer):
    stats = WindowStats()
    assert list(iter_windows([Document("a", "tiny"), Document("b", "tiny too")], tokenizer, 64, stats=stats)) == []
    assert stats.short_documents_left_over == 2


def test_windows_start_with_the_tokenizer_prefix(tokenizer):
    class WithBos:
        """The tiny tokenizer, but putting BOS in front as Llama 3's does."""

        eos_token_id = tokenizer.eos_token_id

        def __call__(self, text, add_special_tokens=True):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            return {"input_ids": ([tokenizer.bos_token_id] if add_special_tokens else []) + ids}

    windows = list(iter_windows([Document("d", "word " * 40)], WithBos(), 16))
    assert windows[0].input_ids[0] == tokenizer.bos_token_id and len(windows[0].input_ids) == 16
    np.testing.assert_array_equal(windows[0].input_ids[1:], tokenizer("word " * 40)["input_ids"][:15])


# --------------------------------------------------------------------------- python-docs and count_windows


def _docs_tree(root, sizes):
    """A fake python3-doc tree: ``_sources/<name>.rst.txt`` with ``n`` words each."""
    src = root / "python3.11" / "html" / "_sources"
    for name, n in sizes.items():
        path = src / f"{name}.rst.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(" ".join(f"word{i % 50}" for i in range(n)))
    return src


def test_installed_python_docs_reads_one_document_per_page_in_path_order(monkeypatch, tmp_path):
    from qkplast.capture import corpus as corpus_module

    src = _docs_tree(tmp_path, {"library/os": 30, "library/os.path": 10, "howto/logging": 20, "about": 5})
    pattern = str(tmp_path / "python3*" / "html" / "_sources")
    monkeypatch.setattr(corpus_module.python_docs_root, "__defaults__", (pattern,))
    with pytest.warns(corpus_module.CorpusDriftWarning):  # a fake tree is not the pinned snapshot
        corpus = open_corpus("python-docs:installed")
    docs = list(corpus)
    # sorted by the file's path: library/os.path.rst.txt comes before library/os.rst.txt
    assert [d.id for d in docs] == ["about", "howto/logging", "library/os.path", "library/os"]
    assert docs[3].text == (src / "library" / "os.rst.txt").read_text()
    assert corpus.details["documents"] == 4 and corpus.details["path"] == str(src.resolve())
    assert corpus.details["source"] == "installed" and corpus.details["matches_snapshot"] is False


def test_installed_python_docs_without_the_package_says_how_to_install(monkeypatch, tmp_path):
    from qkplast.capture import corpus as corpus_module

    monkeypatch.setattr(corpus_module.python_docs_root, "__defaults__", (str(tmp_path / "none*" / "_sources"),))
    with pytest.raises(CorpusError, match="apt-get install python3-doc.*--corpus python-docs"):
        open_corpus("python-docs:installed")
    assert len(list(open_corpus("python-docs"))) > 400  # the pinned snapshot needs no installed package


def test_the_pinned_python_docs_hold_long_documents(tokenizer):
    """The shipped snapshot of the CPython documentation: hundreds of pages, some very long."""
    corpus = open_corpus("python-docs")
    assert corpus.details["documents"] > 400 and corpus.details["source"] == "snapshot"
    longest = max(corpus, key=lambda d: len(d.text))
    assert len(longest.text) > 150_000  # library/stdtypes: ~55K SmolLM2 tokens
    ids = [d.id for d in _first(corpus, 50)]
    assert ids == sorted(ids) and all(not i.endswith(".rst.txt") for i in ids)


def test_count_windows_skips_short_documents_and_stops_at_docs(tokenizer):
    from qkplast import CaptureOptions

    docs = [Document(f"d{i}", "alpha beta gamma " * n) for i, n in enumerate([400, 5, 400, 5, 400])]
    opts = CaptureOptions(seq_len=256, bucket_size=16, docs=2, short_docs="skip")
    assert count_windows(docs, tokenizer, opts) == 2
    assert count_windows(docs, tokenizer, CaptureOptions(**{**opts.to_dict(), "docs": None})) == 3
    # the same number iter_windows yields
    windows = list(iter_windows(docs, tokenizer, 256, short_docs="skip"))
    assert len(windows) == 3 and [w.doc_id for w in windows] == ["d0", "d2", "d4"]
    with pytest.raises(CorpusError, match=r"yields 3 window\(s\) of 256 tokens .* but 4 were asked for"):
        count_windows(docs, tokenizer, CaptureOptions(**{**opts.to_dict(), "docs": 4}))
    assert count_windows(docs, tokenizer, CaptureOptions(**{**opts.to_dict(), "docs": 4}), strict=False) == 3


def test_count_windows_error_names_a_corpus_that_fills_them(tokenizer):
    """pydoc-topics cannot give 3 single 32768-token documents (of this tokenizer); python-docs can, and is named."""
    from qkplast import CaptureOptions

    opts = CaptureOptions(corpus="pydoc-topics", seq_len=32768, bucket_size=2048, docs=3, short_docs="skip")
    with pytest.raises(CorpusError) as info:
        count_windows(open_corpus("pydoc-topics"), tokenizer, opts)
    message = str(info.value)
    assert "corpus 'pydoc-topics' yields" in message and "--corpus python-docs --short-docs skip fills them" in message
    assert count_windows(open_corpus("python-docs"), tokenizer, CaptureOptions(**{**opts.to_dict(),
                                                                                  "corpus": "python-docs"})) == 3


@pytest.mark.parametrize("seq_len", [17, 64, 256, 1000])
def test_windows_counted_from_lengths_are_the_windows_iter_windows_cuts(tokenizer, seq_len):
    """The fill hint counts from token lengths alone: on documents of every kind of length (empty, blank, short,
    exactly a window, long) in a drawn order, the count equals what iter_windows yields under both policies."""
    rng = np.random.default_rng(seq_len)
    words = [len(w) for w in ("", "   ", "x", "alpha beta")] + list(rng.integers(1, 400, size=60))
    docs = [Document(f"d{i}", "" if n == 0 else " " * 3 if n == 3 else "alpha beta gamma " * int(n))
            for i, n in enumerate(rng.permutation(words))]
    lengths = token_lengths(docs, tokenizer, batch=7)  # a batch that does not divide the documents
    assert lengths.tolist() == [len(tokenizer(d.text, add_special_tokens=False)["input_ids"]) if d.text.strip() else 0
                                for d in docs]
    room = seq_len - len(prefix_tokens(tokenizer))
    for policy in ("skip", "concat"):
        cut = len(list(iter_windows(docs, tokenizer, seq_len, short_docs=policy)))
        assert windows_of_lengths(lengths, room, policy) == cut > 0, policy


def test_count_windows_needs_a_resolved_seq_len(tokenizer):
    from qkplast import CaptureOptions

    with pytest.raises(CorpusError, match="resolved seq_len"):
        count_windows([], tokenizer, CaptureOptions(seq_len=None, bucket_size=None))
