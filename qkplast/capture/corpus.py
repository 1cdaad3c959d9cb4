"""Offline text corpora and their cutting into fixed-length token windows.

The thesis captures Q/K on long natural documents (section 4.1.2). This module
provides corpora that work without network access:

``pydoc-topics``
    Prose: the language reference topics every CPython install carries in
    :mod:`pydoc_data.topics` (one document per topic, sorted by topic name).
``python-docs``
    Long natural prose: the reStructuredText sources of the CPython
    documentation that Debian's ``python3-doc`` package ships under
    ``/usr/share/doc/python3.X/html/_sources`` (about 500 documents, one per
    page, the longest ~50K tokens), sorted by path; each document's id is its
    path without ``.rst.txt`` (``library/os``). The default run's corpus.
``stdlib-code``
    Code: the standard library's own ``.py`` sources, sorted by path relative to
    the standard library directory; ``site-packages`` and the regression-test
    packages (``test``, ``tests``, ``idle_test``) are left out, the latter because
    they hold deliberately malformed source files.
a path
    A ``.txt`` file (one document), a ``.jsonl`` file (one document per line,
    text in a configurable field, id from a configurable field when present), or
    a directory of such files, read recursively in sorted path order.
``hf:<name>[:<split>]``
    A Hugging Face dataset with a text column, loaded with
    :func:`datasets.load_dataset` (imported lazily; ``<name>`` may be a hub id or
    a local directory of data files). The split defaults to ``train``.

Every corpus yields documents in a deterministic order, so a capture can be
resumed by regenerating the same windows. :func:`iter_windows` cuts documents
into windows of exactly ``seq_len`` tokens (see its docstring for the policy on
short documents).
"""

from __future__ import annotations

import itertools
import json
import sys
import sysconfig
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qkplast.errors import QkplastError

__all__ = [
    "CorpusError",
    "Document",
    "Corpus",
    "Window",
    "WindowStats",
    "NAMED_CORPORA",
    "SHORT_DOC_POLICIES",
    "open_corpus",
    "open_corpus_for",
    "iter_windows",
    "describe_policy",
    "count_windows",
    "python_docs_root",
]

NAMED_CORPORA = ("python-docs", "pydoc-topics", "stdlib-code")
PYTHON_DOCS_GLOB = "/usr/share/doc/python3*/html/_sources"
SHORT_DOC_POLICIES = ("concat", "skip")
_STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


class CorpusError(QkplastError):
    """A corpus cannot be found, read or cut into windows."""


@dataclass(frozen=True)
class Document:
    """One document: its id, kept exactly as the source gives it, and its text."""

    id: str
    text: str


@dataclass
class Corpus:
    """A named, deterministically ordered source of :class:`Document` objects.

    Attributes
    ----------
    spec : str
        The specification the corpus was opened from (``--corpus``).
    details : dict
        JSON-serialisable description of where the documents come from, stored
        in the capture's attrs for reproducibility.
    """

    spec: str
    details: dict
    _factory: object = field(repr=False)

    def __iter__(self) -> Iterator[Document]:
        return iter(self._factory())


@dataclass(frozen=True)
class Window:
    """A ``seq_len``-token input sequence built from one or more documents.

    Attributes
    ----------
    doc_id : str
        The document id recorded in the capture: the source id for a window cut
        from one document, or the part ids joined by ``+`` for a concatenation.
    parts : tuple of str
        The ids of the documents the window is made of, in order.
    input_ids : numpy.ndarray
        ``int64`` token ids, shape ``[seq_len]``.
    """

    doc_id: str
    parts: tuple[str, ...]
    input_ids: np.ndarray


@dataclass
class WindowStats:
    """Counts of what :func:`iter_windows` did with the documents it read."""

    documents_read: int = 0
    windows: int = 0
    concatenated_windows: int = 0
    short_documents_skipped: int = 0
    short_documents_left_over: int = 0
    empty_documents_skipped: int = 0

    def as_dict(self) -> dict:
        """The counts as a plain dict (for capture attrs)."""
        return dict(self.__dict__)


def _pydoc_topics() -> Iterator[Document]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield Document(name, topics[name])


def python_docs_root(pattern: str = PYTHON_DOCS_GLOB) -> Path:
    """The CPython documentation sources of Debian's python3-doc: the ``_sources`` directory with the most pages.

    Debian links several ``python3*`` doc directories to one tree; the one
    matching the running interpreter's version wins a tie.

    Raises
    ------
    CorpusError
        If no such directory holds ``.rst.txt`` files; the message says how to install them.
    """
    import glob

    own = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = {}
    for directory in sorted(glob.glob(pattern)):
        real = Path(directory).resolve()
        if real not in found:
            count = sum(1 for _ in real.rglob("*.rst.txt"))
            if count:
                found[real] = (count, own in directory)
    if not found:
        raise CorpusError(
            f"corpus 'python-docs' needs the CPython documentation sources of Debian's python3-doc package "
            f"(looked for {pattern}/**/*.rst.txt): install it with 'apt-get install python3-doc', "
            "or pick another corpus (--corpus pydoc-topics, a .txt/.jsonl path or hf:NAME)"
        )
    return max(found, key=lambda d: (found[d][0], found[d][1], str(d)))


def _python_docs(root: Path) -> Iterator[Document]:
    files = sorted(root.rglob("*.rst.txt"), key=lambda p: p.relative_to(root).as_posix())
    for path in files:
        yield Document(path.relative_to(root).as_posix().removesuffix(".rst.txt"),
                       path.read_text(encoding="utf-8", errors="replace"))


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _read_source(path: Path) -> str:
    # tokenize.open honours PEP 263 coding cookies, as the interpreter does.
    try:
        with tokenize.open(path) as f:
            return f.read()
    except (SyntaxError, UnicodeDecodeError):
        return path.read_text(encoding="utf-8", errors="replace")


def _stdlib_files() -> list[Path]:
    root = _stdlib_root()
    files = [p for p in root.rglob("*.py") if not _STDLIB_EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _stdlib_code() -> Iterator[Document]:
    root = _stdlib_root()
    for path in _stdlib_files():
        yield Document(path.relative_to(root).as_posix(), _read_source(path))


def _jsonl_documents(path: Path, text_field: str, id_field: str, id_prefix: str) -> Iterator[Document]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
            yield _record_document(record, text_field, id_field, f"{id_prefix}:{line_no}", f"{path}:{line_no}")


def _record_document(record, text_field: str, id_field: str, fallback_id: str, where: str) -> Document:
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object with a {text_field!r} field, got {type(record).__name__}")
    if text_field not in record:
        raise CorpusError(
            f"{where}: no text field {text_field!r} (fields: {sorted(record)}); choose it with --text-field"
        )
    text = record[text_field]
    if not isinstance(text, str):
        raise CorpusError(f"{where}: field {text_field!r} must be a string, got {type(text).__name__}")
    doc_id = record.get(id_field)
    return Document(fallback_id if doc_id is None else str(doc_id), text)


def _path_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    files = [p for p in root.rglob("*") if p.is_file() and p.suffix in (".txt", ".jsonl")]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _path_documents(root: Path, text_field: str, id_field: str) -> Iterator[Document]:
    for path in _path_files(root):
        rel = path.name if root.is_file() else path.relative_to(root).as_posix()
        if path.suffix == ".jsonl":
            yield from _jsonl_documents(path, text_field, id_field, rel)
        else:
            yield Document(rel, path.read_text(encoding="utf-8", errors="replace"))


def _hf_documents(name: str, split: str, text_field: str, id_field: str) -> Iterator[Document]:
    try:
        import datasets
    except ImportError as exc:
        raise CorpusError(
            "corpus 'hf:...' needs the 'datasets' package, which is not installed: pip install datasets"
        ) from exc
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:  # datasets raises many unrelated types for a missing name, split or file
        raise CorpusError(f"cannot load Hugging Face dataset {name!r} split {split!r}: {exc}") from exc
    if text_field not in ds.column_names:
        raise CorpusError(
            f"dataset {name!r} has no text column {text_field!r} (columns: {ds.column_names}); "
            "choose it with --text-field"
        )
    for i, record in enumerate(ds):
        yield _record_document(record, text_field, id_field, f"{name}:{split}:{i}", f"{name}[{split}][{i}]")


def open_corpus(spec: str, *, text_field: str = "text", id_field: str = "id") -> Corpus:
    """Open a corpus by name, path or ``hf:`` dataset specification.

    Parameters
    ----------
    spec : str
        ``python-docs``, ``pydoc-topics``, ``stdlib-code``, a path to a ``.txt`` / ``.jsonl`` file
        or a directory of them, or ``hf:<name>[:<split>]``.
    text_field, id_field : str
        Fields of ``.jsonl`` records and dataset rows holding the text and the
        document id. Rows without an id get ``<source>:<line or row>``.

    Returns
    -------
    Corpus
        An iterable of :class:`Document`, re-iterable, in a fixed order.

    Raises
    ------
    CorpusError
        If ``spec`` names nothing that exists.
    """
    if spec == "python-docs":
        root = python_docs_root()
        details = {"kind": "named", "name": spec, "source": str(root), "package": "Debian python3-doc",
                   "documents": sum(1 for _ in root.rglob("*.rst.txt"))}
        return Corpus(spec, details, lambda: _python_docs(root))
    if spec == "pydoc-topics":
        details = {"kind": "named", "name": spec, "source": "pydoc_data.topics", "python": sys.version.split()[0]}
        return Corpus(spec, details, _pydoc_topics)
    if spec == "stdlib-code":
        details = {
            "kind": "named",
            "name": spec,
            "source": str(_stdlib_root()),
            "python": sys.version.split()[0],
            "excluded_dirs": sorted(_STDLIB_EXCLUDED_DIRS),
        }
        return Corpus(spec, details, _stdlib_code)
    if spec.startswith("hf:"):
        name, _, split = spec[3:].partition(":")
        if not name:
            raise CorpusError(f"corpus {spec!r}: expected hf:<name>[:<split>]")
        split = split or "train"
        details = {"kind": "hf", "name": name, "split": split, "text_field": text_field, "id_field": id_field}
        return Corpus(spec, details, lambda: _hf_documents(name, split, text_field, id_field))
    path = Path(spec)
    if not path.exists():
        raise CorpusError(
            f"unknown corpus {spec!r}: not a named corpus ({', '.join(NAMED_CORPORA)}), not hf:<name>, "
            "and no such file or directory"
        )
    if path.is_file() and path.suffix not in (".txt", ".jsonl"):
        raise CorpusError(f"corpus file {spec!r} must end in .txt or .jsonl")
    files = _path_files(path)
    if not files:
        raise CorpusError(f"corpus directory {spec!r} holds no .txt or .jsonl files")
    details = {
        "kind": "path",
        "path": str(path.resolve()),
        "files": len(files),
        "text_field": text_field,
        "id_field": id_field,
    }
    return Corpus(spec, details, lambda: _path_documents(path, text_field, id_field))


def open_corpus_for(options) -> Corpus:
    """The corpus a capture's options name, read with their ``text_field`` and ``id_field``.

    Every caller that has :class:`~qkplast.options.CaptureOptions` opens its corpus here, so a study's
    ``text_field: context`` reaches every reader of the corpus, not only the capture.
    """
    return open_corpus(options.corpus, text_field=options.text_field, id_field=options.id_field)


def encode_text(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _prefix_tokens(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts in front of a text (e.g. BOS), so windows start as the model expects."""
    probe = "qkplast"
    with_special = tokenizer(probe)["input_ids"]
    without = encode_text(tokenizer, probe)
    for start in range(len(with_special) - len(without) + 1):
        if with_special[start : start + len(without)] == without:
            return list(with_special[:start])
    return []


def iter_windows(
    documents: Iterable[Document],
    tokenizer,
    seq_len: int,
    *,
    short_docs: str = "concat",
    stats: WindowStats | None = None,
) -> Iterator[Window]:
    """Cut documents into windows of exactly ``seq_len`` tokens.

    Each window starts with the special tokens the tokenizer puts in front of a
    text (BOS for Llama 3, nothing for SmolLM2). A document that fills a window
    on its own gives one window, truncated to ``seq_len`` tokens, with its id
    unchanged. Shorter documents follow ``short_docs``:

    ``"concat"``
        Short documents are concatenated in corpus order, separated by the
        tokenizer's EOS token, until the window is full; the last part is cut at
        ``seq_len`` and its remainder dropped. The window's id is the part ids
        joined by ``+``. Short documents still pending when the corpus ends are
        counted in ``stats.short_documents_left_over``.
    ``"skip"``
        Short documents are skipped and counted in ``stats.short_documents_skipped``.

    Documents with no text are skipped and counted in either case.

    Parameters
    ----------
    documents : iterable of Document
    tokenizer : transformers tokenizer
    seq_len : int
        Window length in tokens.
    short_docs : {"concat", "skip"}
    stats : WindowStats, optional
        Updated in place while iterating.

    Yields
    ------
    Window
    """
    if short_docs not in SHORT_DOC_POLICIES:
        raise CorpusError(f"short_docs must be one of {SHORT_DOC_POLICIES}, got {short_docs!r}")
    if seq_len <= 0:
        raise CorpusError(f"seq_len must be positive, got {seq_len}")
    stats = WindowStats() if stats is None else stats
    prefix = _prefix_tokens(tokenizer)
    room = seq_len - len(prefix)
    if room <= 0:
        raise CorpusError(f"seq_len {seq_len} leaves no room after the tokenizer's {len(prefix)} prefix tokens")
    separator = tokenizer.eos_token_id
    if short_docs == "concat" and separator is None:
        raise CorpusError("the tokenizer has no EOS token to separate concatenated documents; use short_docs='skip'")
    pending_ids: list[str] = []
    pending_tokens: list[int] = []
    for doc in documents:
        stats.documents_read += 1
        tokens = encode_text(tokenizer, doc.text) if doc.text.strip() else []
        if not tokens:
            stats.empty_documents_skipped += 1
            continue
        if len(tokens) >= room:
            stats.windows += 1
            yield Window(doc.id, (doc.id,), np.asarray(prefix + tokens[:room], dtype=np.int64))
            continue
        if short_docs == "skip":
            stats.short_documents_skipped += 1
            continue
        if pending_tokens:
            pending_tokens.append(separator)
        pending_ids.append(doc.id)
        pending_tokens.extend(tokens)
        if len(pending_tokens) >= room:
            stats.windows += 1
            stats.concatenated_windows += 1
            parts = tuple(pending_ids)
            yield Window("+".join(parts), parts, np.asarray(prefix + pending_tokens[:room], dtype=np.int64))
            pending_ids, pending_tokens = [], []
    stats.short_documents_left_over = len(pending_ids)


def describe_policy(short_docs: str) -> str:
    """One sentence stating the short-document policy, for the capture's attrs."""
    if short_docs == "concat":
        return (
            "documents shorter than seq_len are concatenated in corpus order with the tokenizer's EOS between them "
            "and cut at seq_len (the last part's remainder is dropped); the window id joins the part ids with '+'; "
            "longer documents are truncated to seq_len"
        )
    return "documents shorter than seq_len are skipped and counted; longer documents are truncated to seq_len"


def count_windows(corpus: Corpus | Iterable[Document], tokenizer, options, *, strict: bool = True) -> int:
    """The windows ``corpus`` yields for the capture ``options``, counted by tokenizing only (no model).

    Counting stops once ``options.docs`` windows are found, so the check costs
    the tokenization of the documents the capture will read anyway.

    Parameters
    ----------
    corpus : Corpus or iterable of Document
    tokenizer : transformers tokenizer
    options : qkplast.CaptureOptions
        ``seq_len`` (resolved, not None), ``docs``, ``short_docs``.
    strict : bool
        Raise when the corpus cannot fill the request (default); otherwise just count.

    Returns
    -------
    int
        ``min(windows, options.docs)``.

    Raises
    ------
    CorpusError
        With ``strict``: fewer windows than ``options.docs`` (or none at all);
        the message names a corpus that can fill them, when one exists here.
    """
    if options.seq_len is None:
        raise CorpusError("count_windows needs a resolved seq_len (the model's maximum when the option is None)")
    stats = WindowStats()
    windows = iter_windows(corpus, tokenizer, options.seq_len, short_docs=options.short_docs, stats=stats)
    n = sum(1 for _ in itertools.islice(windows, options.docs))
    wanted = options.docs or 1
    if strict and n < wanted:
        spec = corpus.spec if isinstance(corpus, Corpus) else "in-memory documents"
        raise CorpusError(
            f"corpus {spec!r} yields {n} window(s) of {options.seq_len} tokens with short_docs={options.short_docs!r} "
            f"({stats.documents_read} documents read, {stats.short_documents_skipped} shorter ones skipped, "
            f"{stats.short_documents_left_over} left over), but {wanted} were asked for; "
            + _fill_hint(spec, tokenizer, options, wanted)
        )
    return n


def _fill_hint(spec: str, tokenizer, options, wanted: int) -> str:
    """Which offline corpus (and policy) fills ``wanted`` windows for these options, checked by counting."""
    from dataclasses import replace

    generic = (f"pass longer documents (--corpus FILE.jsonl or hf:NAME), fewer --docs, or a shorter --seq-len "
               f"than {options.seq_len}")
    try:
        docs = open_corpus("python-docs")
    except CorpusError:
        return generic + " (the long-document corpus python-docs needs 'apt-get install python3-doc')"
    for policy in ("skip", "concat"):
        if spec == "python-docs" and policy == options.short_docs:
            continue
        trial = replace(options, short_docs=policy)
        if count_windows(docs, tokenizer, trial, strict=False) >= wanted:
            how = "single documents" if policy == "skip" else "short documents concatenated"
            return f"--corpus python-docs --short-docs {policy} fills them ({how})"
    return "no offline corpus here holds that many; " + generic
