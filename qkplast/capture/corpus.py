"""Offline text corpora and their cutting into fixed-length token windows.

The thesis captures Q/K on long natural documents (section 4.1.2). This module
provides corpora that work without network access:

``pydoc-topics``
    Prose: the language reference topics every CPython install carries in
    :mod:`pydoc_data.topics` (one document per topic, sorted by topic name).
``python-docs``
    Long natural prose: the reStructuredText sources of the CPython
    documentation (about 500 documents, one per page, the longest ~50K
    tokens), sorted by path; each document's id is its path without
    ``.rst.txt`` (``library/os``). The default run's corpus. Pinned by content:
    read from the snapshot the project ships (``data/corpora/python-docs.tar.xz``,
    made from Debian's ``python3.11-doc`` 3.11.2-6+deb12u9 by
    ``scripts/make_corpus_snapshot.py``), whose manifest records every
    document's sha256; the content hash is checked on the first read in a
    process. ``python-docs:installed`` reads the installed package instead
    (Debian's ``python3-doc``, ``/usr/share/doc/python3.X/html/_sources``) and
    warns in one line when its content differs from the snapshot's.
``stdlib-code``
    Code: the standard library's own ``.py`` sources, sorted by path relative to
    the standard library directory; ``site-packages`` and the regression-test
    packages (``test``, ``tests``, ``idle_test``) are left out, the latter because
    they hold deliberately malformed source files. Pinned like ``python-docs``
    (``data/corpora/stdlib-code.tar.xz``, made from CPython 3.11.7);
    ``stdlib-code:installed`` reads the running interpreter's standard library.
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

import functools
import hashlib
import io
import itertools
import json
import lzma
import subprocess
import sys
import sysconfig
import tarfile
import tokenize
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qkplast.errors import QkplastError
from qkplast.resources import resource_dir

__all__ = [
    "CorpusError",
    "CorpusDriftWarning",
    "Document",
    "Corpus",
    "Window",
    "WindowStats",
    "shortfall",
    "NAMED_CORPORA",
    "SHORT_DOC_POLICIES",
    "open_corpus",
    "open_corpus_for",
    "iter_windows",
    "describe_policy",
    "count_windows",
    "length_batches",
    "token_lengths",
    "windows_of_lengths",
    "python_docs_root",
    "PINNED_CORPORA",
    "snapshot_dir",
    "read_manifest",
    "write_snapshot",
    "prefix_tokens",
]

NAMED_CORPORA = ("python-docs", "pydoc-topics", "stdlib-code")
PYTHON_DOCS_GLOB = "/usr/share/doc/python3*/html/_sources"
SHORT_DOC_POLICIES = ("concat", "skip")
_STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
#: The corpora read from a shipped snapshot (pinned by content), each with the suffix its archive members carry
#: after the document id (``library/os`` is ``library/os.rst.txt``, the file's name in the installed tree).
PINNED_CORPORA = {"python-docs": ".rst.txt", "stdlib-code": ""}
#: Appended to a pinned corpus's name, reads the installed files instead of the snapshot.
INSTALLED = ":installed"
#: Where the snapshots lie: the checkout's folder, or the wheel's copy (qkplast.resources).
SNAPSHOT_FOLDER = "data/corpora"
SNAPSHOT_FORMAT = 1
#: Every archive member's mtime (2000-01-01 UTC): a fixed value, so that regenerating a snapshot gives the same bytes.
SNAPSHOT_MTIME = 946684800


class CorpusError(QkplastError):
    """A corpus cannot be found, read or cut into windows."""


class CorpusDriftWarning(UserWarning):
    """An installed corpus (``NAME:installed``) differs from the snapshot the project pins."""


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
    """The installed CPython documentation sources of Debian's python3-doc: the ``_sources`` directory with the
    most pages (read by ``python-docs:installed`` and by the snapshot's maker; ``python-docs`` needs none).

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
            f"corpus 'python-docs{INSTALLED}' needs the CPython documentation sources of Debian's python3-doc "
            f"package (looked for {pattern}/**/*.rst.txt): install it with 'apt-get install python3-doc', "
            "or read the pinned snapshot the project ships (--corpus python-docs)"
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


# --------------------------------------------------------------------------- pinned snapshots of the named corpora


def snapshot_dir() -> Path:
    """The folder of the pinned corpus snapshots: ``data/corpora`` of the checkout, or the wheel's copy."""
    return resource_dir(SNAPSHOT_FOLDER)


def _document_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _content_sha256(listing: Iterable[tuple[str, str]]) -> str:
    """sha256 of the lines ``<document sha256>  <id>`` in corpus order (``sha256sum``'s listing format), the
    document's sha256 taken of its UTF-8 text."""
    digest = hashlib.sha256()
    for doc_id, sha in listing:
        digest.update(f"{sha}  {doc_id}\n".encode())
    return digest.hexdigest()


def _fix_hint(name: str) -> str:
    return (f"restore {SNAPSHOT_FOLDER}/{name}.tar.xz and {name}.json from the repository (git checkout -- "
            f"{SNAPSHOT_FOLDER}) or reinstall qkplast; a deliberate new snapshot is made with "
            f"'python scripts/make_corpus_snapshot.py {name}'")


def read_manifest(name: str, directory: Path | None = None) -> dict:
    """The manifest of the pinned corpus ``name``: its source, every document's id and sha256, the content hash.

    Raises
    ------
    CorpusError
        If the manifest or its archive is missing or unreadable (one line naming the file and the fix).
    """
    directory = snapshot_dir() if directory is None else Path(directory)
    path = directory / f"{name}.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CorpusError(f"corpus {name!r}: cannot read its snapshot manifest {path} ({exc.__class__.__name__}); "
                          + _fix_hint(name)) from exc
    if manifest.get("format") != SNAPSHOT_FORMAT or manifest.get("corpus") != name:
        raise CorpusError(f"corpus {name!r}: {path} is not a format-{SNAPSHOT_FORMAT} manifest of {name!r}; "
                          + _fix_hint(name))
    if not (directory / manifest["archive"]).is_file():
        raise CorpusError(f"corpus {name!r}: the snapshot {directory / manifest['archive']} is missing; "
                          + _fix_hint(name))
    return manifest


def _snapshot_documents(name: str, directory: Path, manifest: dict) -> Iterator[Document]:
    archive = directory / manifest["archive"]
    stat = archive.stat()
    return iter(_verified_snapshot(name, archive, stat.st_mtime_ns, stat.st_size, manifest["content_sha256"],
                                   tuple(tuple(pair) for pair in manifest["documents"])))


@functools.lru_cache(maxsize=4)
def _verified_snapshot(name: str, archive: Path, mtime_ns: int, size: int, content_sha256: str,
                       listing: tuple[tuple[str, str], ...]) -> tuple[Document, ...]:
    """The documents of ``archive``, read once per process (per version of the file) and checked against the
    manifest: the ids in order, each document's sha256, and the content hash of the whole."""
    suffix = PINNED_CORPORA[name]
    damaged = f"corpus {name!r}: the snapshot {archive}"
    try:
        with tarfile.open(fileobj=io.BytesIO(lzma.decompress(archive.read_bytes())), mode="r:") as tar:
            members = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    except (OSError, lzma.LZMAError, tarfile.TarError, EOFError) as exc:
        raise CorpusError(f"{damaged} cannot be read ({exc}); " + _fix_hint(name)) from exc
    if _content_sha256(listing) != content_sha256:
        raise CorpusError(f"corpus {name!r}: the manifest {archive.parent / (name + '.json')}'s document list does "
                          "not give its content_sha256; " + _fix_hint(name))
    if len(members) != len(listing):
        raise CorpusError(f"{damaged} holds {len(members)} documents, its manifest {len(listing)}; " + _fix_hint(name))
    documents = []
    for (member, data), (doc_id, sha) in zip(members, listing):
        if member != doc_id + suffix or hashlib.sha256(data).hexdigest() != sha:
            raise CorpusError(f"{damaged} does not match its manifest's content hash {content_sha256[:12]} at "
                              f"{member!r} (expected {doc_id + suffix!r}, sha256 {sha[:12]}); " + _fix_hint(name))
        documents.append(Document(doc_id, data.decode("utf-8")))
    return tuple(documents)


def _snapshot_archive(documents: Iterable[Document], suffix: str) -> bytes:
    """The xz-compressed :func:`_snapshot_tar` of ``documents`` (the strongest preset: it is made once, read often)."""
    return lzma.compress(_snapshot_tar(documents, suffix), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                         preset=9 | lzma.PRESET_EXTREME)


def _snapshot_tar(documents: Iterable[Document], suffix: str) -> bytes:
    """The tar of ``documents`` in the given order, byte-for-byte reproducible: each member holds the UTF-8 text
    under the id plus ``suffix``, with a fixed mtime, owner and mode, and there are no directory entries."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for doc in documents:
            data = doc.text.encode("utf-8")
            info = tarfile.TarInfo(doc.id + suffix)
            info.size, info.mtime, info.mode = len(data), SNAPSHOT_MTIME, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_snapshot(name: str, directory: Path) -> dict:
    """Pin the installed corpus ``name``: write ``<name>.tar.xz`` and its manifest ``<name>.json`` into ``directory``.

    The documents are those ``open_corpus(name + ":installed")`` yields, in that order and with that text; running
    it again on the same installed files writes the same bytes (``scripts/make_corpus_snapshot.py --check``).

    Parameters
    ----------
    name : {"python-docs", "stdlib-code"}
    directory : pathlib.Path
        Created when missing; ``data/corpora`` for the snapshots the project ships.

    Returns
    -------
    dict
        The manifest: the source's version and path, every document's id and sha256, the content hash.
    """
    if name not in PINNED_CORPORA:
        raise CorpusError(f"no snapshot is made of {name!r}; pinned corpora: {', '.join(PINNED_CORPORA)}")
    factory, source = _installed(name)
    documents = list(factory())
    listing = [(doc.id, _document_sha256(doc.text)) for doc in documents]
    archive = f"{name}.tar.xz"
    manifest = {
        "format": SNAPSHOT_FORMAT,
        "corpus": name,
        "archive": archive,
        "made_from": source["version"],
        "source": source,
        "license": "PSF License Agreement for Python (the text: document 'license' of the python-docs snapshot)",
        "text": "each member holds one document's text, UTF-8, exactly as open_corpus yields it (the installed file "
                "decoded as the reader decodes it, newlines translated); members in corpus order, named by the id "
                f"plus {PINNED_CORPORA[name]!r}",
        "content_hash": "sha256 of the lines '<document sha256>  <id>\\n' in corpus order",
        "content_sha256": _content_sha256(listing),
        "n_documents": len(documents),
        "text_bytes": sum(len(doc.text.encode("utf-8")) for doc in documents),
        "documents": [list(pair) for pair in listing],
    }
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / archive).write_bytes(_snapshot_archive(documents, PINNED_CORPORA[name]))
    (directory / f"{name}.json").write_text(_manifest_text(manifest), encoding="utf-8")
    return manifest


def _manifest_text(manifest: dict) -> str:
    """The manifest as JSON, one ``["id", "sha256"]`` pair per line (so that a diff of two snapshots reads)."""
    head = json.dumps({k: v for k, v in manifest.items() if k != "documents"}, indent=1)
    pairs = ",\n".join("  " + json.dumps(pair) for pair in manifest["documents"])
    return head[:-2] + ',\n "documents": [\n' + pairs + "\n ]\n}\n"


def _debian_package(path: Path) -> str:
    """``package version`` of the Debian package that installed ``path`` (``unknown package`` off Debian)."""
    try:
        owner = subprocess.run(["dpkg-query", "-S", str(path)], capture_output=True, text=True, timeout=60)
        if owner.returncode == 0:
            package = owner.stdout.split(":", 1)[0].split(",")[0].strip()
            version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                                     text=True, timeout=60)
            if version.returncode == 0 and version.stdout.strip():
                return f"{package} {version.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown package"


def _installed(name: str):
    """``(factory of the installed documents, description of their source)`` of the pinned corpus ``name``."""
    if name == "python-docs":
        root = python_docs_root()
        source = {"version": _debian_package(root), "path": str(root),
                  "reader": "the .rst.txt files under the path, sorted by relative path"}
        return (lambda: _python_docs(root)), source
    python = f"{sys.implementation.name} {sys.version.split()[0]}".replace("cpython", "CPython")
    excluded = sorted(_STDLIB_EXCLUDED_DIRS)
    source = {"version": python, "path": str(_stdlib_root()),
              "reader": f"the .py files under the path, sorted by relative path, except in {excluded}"}
    return _stdlib_code, source


def _open_pinned(name: str) -> Corpus:
    directory = snapshot_dir()
    manifest = read_manifest(name, directory)
    details = {"kind": "named", "name": name, "source": "snapshot", "snapshot": manifest["archive"],
               "made_from": manifest["made_from"], "documents": manifest["n_documents"],
               "content_sha256": manifest["content_sha256"]}
    return Corpus(name, details, lambda: _snapshot_documents(name, directory, manifest))


def _open_installed(spec: str, name: str) -> Corpus:
    """The installed files of a pinned corpus, hashed once here so that a difference from the snapshot is said."""
    factory, source = _installed(name)
    listing = [(doc.id, _document_sha256(doc.text)) for doc in factory()]
    content = _content_sha256(listing)
    details = {"kind": "named", "name": name, "source": "installed", "path": source["path"],
               "made_from": source["version"], "documents": len(listing), "content_sha256": content}
    try:
        pinned = read_manifest(name)
    except CorpusError:
        pinned = None
    details["matches_snapshot"] = pinned is not None and pinned["content_sha256"] == content
    if pinned is not None and not details["matches_snapshot"]:
        warnings.warn(_drift(spec, source, listing, pinned), CorpusDriftWarning, stacklevel=3)
    return Corpus(spec, details, factory)


def _drift(spec: str, source: dict, listing: list[tuple[str, str]], pinned: dict) -> str:
    """One line: the installed and the pinned versions, and which documents differ."""
    ours, theirs = dict(listing), dict(map(tuple, pinned["documents"]))
    differ = sorted(i for i in ours.keys() | theirs.keys() if ours.get(i) != theirs.get(i))
    shown = ", ".join(differ[:4]) + (", ..." if len(differ) > 4 else "")
    return (f"corpus {spec!r} reads {source['version']} ({source['path']}), whose content differs from the pinned "
            f"snapshot's ({pinned['made_from']}) in {len(differ)} of {len(theirs)} documents ({shown}); results "
            f"will not match the book's: drop '{INSTALLED}' to read the snapshot")


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
        ``python-docs``, ``pydoc-topics``, ``stdlib-code``, ``python-docs:installed``,
        ``stdlib-code:installed``, a path to a ``.txt`` / ``.jsonl`` file or a directory of them, or
        ``hf:<name>[:<split>]``. ``python-docs`` and ``stdlib-code`` read the shipped snapshot, checked
        against its manifest's content hash on the first read; ``:installed`` reads the installed files
        and warns (:class:`CorpusDriftWarning`, one line naming both versions) when they differ from it.
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
        If ``spec`` names nothing that exists, or (when read) a snapshot that does not match its manifest.
    """
    if spec in PINNED_CORPORA:
        return _open_pinned(spec)
    if spec.endswith(INSTALLED) and spec.removesuffix(INSTALLED) in PINNED_CORPORA:
        return _open_installed(spec, spec.removesuffix(INSTALLED))
    if spec == "pydoc-topics":
        details = {"kind": "named", "name": spec, "source": "pydoc_data.topics", "python": sys.version.split()[0]}
        return Corpus(spec, details, _pydoc_topics)
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
            f"unknown corpus {spec!r}: not a named corpus ({', '.join(NAMED_CORPORA)}, or "
            f"{' / '.join(n + INSTALLED for n in PINNED_CORPORA)}), not hf:<name>, and no such file or directory"
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


def prefix_tokens(tokenizer) -> list[int]:
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
    prefix = prefix_tokens(tokenizer)
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
    problem = shortfall(corpus, tokenizer, options, n, stats) if strict else None
    if problem is not None:
        raise problem
    return n


def shortfall(corpus, tokenizer, options, found: int, stats: WindowStats) -> CorpusError | None:
    """The error :func:`count_windows` raises when ``found`` windows (read with ``stats``) are fewer than asked.

    Parameters
    ----------
    corpus : Corpus or iterable of Document
        Named in the message.
    tokenizer, options
        As for :func:`count_windows` (the hint counts other corpora with them).
    found : int
        Windows the corpus yielded, at most ``options.docs``.
    stats : WindowStats
        What reading them found (documents read, short ones skipped or left over).

    Returns
    -------
    CorpusError or None
        None when the corpus fills the request.
    """
    wanted = options.docs or 1
    if found >= wanted:
        return None
    spec = corpus.spec if isinstance(corpus, Corpus) else "in-memory documents"
    return CorpusError(
        f"corpus {spec!r} yields {found} window(s) of {options.seq_len} tokens with short_docs={options.short_docs!r} "
        f"({stats.documents_read} documents read, {stats.short_documents_skipped} shorter ones skipped, "
        f"{stats.short_documents_left_over} left over), but {wanted} were asked for; "
        + _fill_hint(spec, tokenizer, options, wanted)
    )


def _fill_hint(spec: str, tokenizer, options, wanted: int) -> str:
    """Which offline corpus (and policy) fills ``wanted`` windows for these options, checked by counting."""
    generic = (f"pass longer documents (--corpus FILE.jsonl or hf:NAME), fewer --docs, or a shorter --seq-len "
               f"than {options.seq_len}")
    try:
        docs = open_corpus("python-docs")
    except CorpusError as exc:
        return generic + f" (the long-document corpus python-docs cannot be read here: {exc})"
    policies = [p for p in ("skip", "concat") if not (spec == "python-docs" and p == options.short_docs)]
    if tokenizer.eos_token_id is None:
        policies = [p for p in policies if p != "concat"]  # iter_windows refuses to concatenate without a separator
    room = options.seq_len - len(prefix_tokens(tokenizer))
    lengths = np.zeros(0, dtype=np.int64)  # [document read]: one tokenization serves every policy
    for batch in length_batches(docs, tokenizer):
        lengths = np.concatenate([lengths, batch])
        if policies and windows_of_lengths(lengths, room, policies[0]) >= wanted:
            break  # the first policy named fills them: the rest of the corpus cannot change the hint
    for policy in policies:
        if windows_of_lengths(lengths, room, policy) >= wanted:
            how = "single documents" if policy == "skip" else "short documents concatenated"
            return f"--corpus python-docs --short-docs {policy} fills them ({how})"
    return "no offline corpus here holds that many; " + generic


def length_batches(documents: Iterable[Document], tokenizer, batch: int = 32) -> Iterator[np.ndarray]:
    """:func:`token_lengths` a batch at a time, ``[batch]`` each: 1, 2, 4, ... documents up to ``batch``, so a caller
    that stops after a few documents has tokenized few more."""
    documents, size = iter(documents), 1
    while texts := [doc.text if doc.text.strip() else "" for doc in itertools.islice(documents, size)]:
        yield np.asarray([len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]], dtype=np.int64)
        size = min(2 * size, batch)


def token_lengths(documents: Iterable[Document], tokenizer, batch: int = 32) -> np.ndarray:
    """Tokens of each document as :func:`iter_windows` encodes it (0 for a document with no text), ``[document]``.

    Documents are encoded up to ``batch`` at a time and only their lengths kept, so a whole corpus is measured in
    the memory of one batch."""
    return np.concatenate([np.zeros(0, dtype=np.int64), *length_batches(documents, tokenizer, batch)])


def windows_of_lengths(lengths: np.ndarray, room: int, short_docs: str) -> int:
    """The windows :func:`iter_windows` cuts from documents of these token ``lengths`` when ``room`` tokens of a
    window follow the tokenizer's prefix: one per document of ``room`` tokens or more; under ``"concat"`` also one
    each time the shorter ones, in corpus order with one separator between them, reach ``room``."""
    lengths = np.asarray(lengths, dtype=np.int64)  # [document]
    windows = int((lengths >= room).sum())
    if short_docs == "skip":
        return windows
    pending = 0  # tokens waiting for the next concatenated window; the cumulative sum restarts at each window
    for length in lengths[(lengths > 0) & (lengths < room)].tolist():
        pending = length if pending == 0 else pending + 1 + length
        if pending >= room:
            windows, pending = windows + 1, 0
    return windows
