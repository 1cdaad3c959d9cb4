"""The named corpora pinned by content: the shipped snapshots, their manifests and the check on reading them."""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import lzma
import sys
import tarfile
import warnings

import pytest

from qkplast.capture import corpus as corpus_module
from qkplast.capture.corpus import (
    PINNED_CORPORA,
    CorpusDriftWarning,
    CorpusError,
    Document,
    open_corpus,
    read_manifest,
    snapshot_dir,
    write_snapshot,
)
from tests.helpers import ROOT


def _installed_version(name: str) -> str:
    """The version the installed files of ``name`` come from, or a skip saying why they cannot be compared."""
    if name == "python-docs":
        try:
            root = corpus_module.python_docs_root()
        except CorpusError:
            pytest.skip("Debian's python3-doc is not installed: nothing to compare the python-docs snapshot with")
        return corpus_module._debian_package(root)
    return f"CPython {sys.version.split()[0]}" if sys.implementation.name == "cpython" else sys.version


def _skip_unless_pinned_version_installed(name: str) -> dict:
    manifest = read_manifest(name)
    installed = _installed_version(name)
    if installed != manifest["made_from"]:
        pytest.skip(f"{name}: {installed} is installed, the snapshot was made from {manifest['made_from']}")
    return manifest


@pytest.mark.parametrize("name", list(PINNED_CORPORA))
def test_the_snapshot_reads_as_the_installed_files_it_was_made_from(name):
    """Same ids, same order, same text byte for byte as reading the installed files (where they are here)."""
    manifest = _skip_unless_pinned_version_installed(name)
    pinned = list(open_corpus(name))
    installed = open_corpus(name + ":installed")
    assert installed.details["matches_snapshot"] is True
    assert installed.details["content_sha256"] == manifest["content_sha256"]
    assert [d.id for d in pinned] == [d.id for d in installed]
    assert pinned == list(installed)


@pytest.mark.parametrize("name", list(PINNED_CORPORA))
def test_the_committed_archive_is_what_the_maker_makes_from_the_installed_files(name):
    """Regenerating gives the same tar (compared before compression, which costs a minute)."""
    _skip_unless_pinned_version_installed(name)
    factory, _ = corpus_module._installed(name)
    made = corpus_module._snapshot_tar(factory(), PINNED_CORPORA[name])
    committed = lzma.decompress((snapshot_dir() / f"{name}.tar.xz").read_bytes())
    assert hashlib.sha256(made).hexdigest() == hashlib.sha256(committed).hexdigest()


@pytest.mark.parametrize("name", list(PINNED_CORPORA))
def test_the_manifest_records_source_documents_and_content_hash(name):
    manifest = read_manifest(name)
    corpus = open_corpus(name)
    docs = list(corpus)
    assert [d.id for d in docs] == [doc_id for doc_id, _ in manifest["documents"]]
    assert [hashlib.sha256(d.text.encode()).hexdigest() for d in docs] == [sha for _, sha in manifest["documents"]]
    listing = "".join(f"{sha}  {doc_id}\n" for doc_id, sha in manifest["documents"])
    assert hashlib.sha256(listing.encode()).hexdigest() == manifest["content_sha256"]
    assert manifest["n_documents"] == len(docs) == corpus.details["documents"]
    assert manifest["text_bytes"] == sum(len(d.text.encode()) for d in docs)
    expected = {"python-docs": "python3.11-doc 3.11.2-6+deb12u9", "stdlib-code": "CPython 3.11.7"}[name]
    assert manifest["made_from"] == corpus.details["made_from"] == expected
    assert corpus.details["content_sha256"] == manifest["content_sha256"] and corpus.details["source"] == "snapshot"


def test_a_wheel_ships_the_snapshots():
    """setup.py copies data/corpora into the wheel, every file of it, and qkplast.resources finds that folder."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    shipped = next(ast.literal_eval(node.value) for node in tree.body
                   if isinstance(node, ast.AnnAssign | ast.Assign)
                   and getattr(node.targets[0] if isinstance(node, ast.Assign) else node.target, "id", "") == "SHIPPED")
    patterns = shipped["data/corpora"]
    files = sorted(p.name for p in (ROOT / "data" / "corpora").iterdir())
    assert files == sorted(f"{n}{ext}" for n in PINNED_CORPORA for ext in (".json", ".tar.xz"))
    assert all(any(fnmatch.fnmatch(f, pattern) for pattern in patterns) for f in files)
    assert snapshot_dir() == ROOT / "data" / "corpora"  # the checkout's folder here


# --------------------------------------------------------------------------- snapshots made here from a fake tree


def _docs_tree(root, texts):
    src = root / "python3.11" / "html" / "_sources"
    for name, text in texts.items():
        path = src / f"{name}.rst.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text)
    return src


@pytest.fixture
def fake_docs(monkeypatch, tmp_path):
    """A fake python3-doc tree (CRLF newlines, a byte that is not UTF-8) and a snapshot of it in ``tmp/pinned``."""
    src = _docs_tree(tmp_path / "doc", {"library/os": b"os\r\nmodule\n" * 50, "library/os.path": b"path \xff\n",
                                        "about": b"about"})
    pattern = str(tmp_path / "doc" / "python3*" / "html" / "_sources")
    monkeypatch.setattr(corpus_module.python_docs_root, "__defaults__", (pattern,))
    monkeypatch.setattr(corpus_module, "snapshot_dir", lambda: tmp_path / "pinned")
    manifest = write_snapshot("python-docs", tmp_path / "pinned")
    return src, tmp_path / "pinned", manifest


def test_a_snapshot_is_reproducible_and_reads_as_the_installed_tree(fake_docs, tmp_path):
    src, pinned, manifest = fake_docs
    again = write_snapshot("python-docs", tmp_path / "again")
    for file in ("python-docs.tar.xz", "python-docs.json"):
        assert (pinned / file).read_bytes() == (tmp_path / "again" / file).read_bytes()
    assert again == manifest and manifest["n_documents"] == 3
    with tarfile.open(pinned / "python-docs.tar.xz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["about.rst.txt", "library/os.path.rst.txt", "library/os.rst.txt"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(946684800, 0, 0, "", "", 0o644)}
    docs = list(open_corpus("python-docs"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        installed = open_corpus("python-docs:installed")
    assert docs == list(installed) and installed.details["matches_snapshot"] is True
    assert not [w for w in caught if issubclass(w.category, CorpusDriftWarning)]
    assert docs[2] == Document("library/os", "os\nmodule\n" * 50)  # newlines as the reader translates them
    assert docs[1].text == "path \ufffd\n"


def test_a_damaged_snapshot_is_one_line_naming_the_file_and_the_fix(fake_docs):
    _, pinned, _ = fake_docs
    archive = pinned / "python-docs.tar.xz"
    changed = [Document("about", "about"), Document("library/os.path", "path \ufffd\n"),
               Document("library/os", "os\nmodule\n" * 49)]
    archive.write_bytes(corpus_module._snapshot_archive(changed, ".rst.txt"))
    corpus = open_corpus("python-docs")  # opening reads the manifest only; the first read checks the content
    with pytest.raises(CorpusError) as info:
        next(iter(corpus))
    message = str(info.value)
    assert "\n" not in message and str(archive) in message and "'library/os.rst.txt'" in message
    assert "git checkout -- data/corpora" in message and "make_corpus_snapshot.py python-docs" in message
    archive.write_bytes(b"not xz")
    with pytest.raises(CorpusError, match=r"cannot be read .*git checkout"):
        list(open_corpus("python-docs"))


def test_an_edited_manifest_or_a_missing_snapshot_is_refused(fake_docs):
    _, pinned, _ = fake_docs
    manifest = pinned / "python-docs.json"
    manifest.write_text(manifest.read_text().replace('"about"', '"About"'))
    with pytest.raises(CorpusError, match=r"manifest .*python-docs.json's document list does not give its content"):
        list(open_corpus("python-docs"))
    (pinned / "python-docs.tar.xz").unlink()
    with pytest.raises(CorpusError, match=r"python-docs.tar.xz is missing; restore"):
        open_corpus("python-docs")
    manifest.unlink()
    with pytest.raises(CorpusError, match=r"cannot read its snapshot manifest .*python-docs.json"):
        open_corpus("python-docs")


def test_installed_files_that_differ_from_the_snapshot_are_said_in_one_line(fake_docs):
    src, _, manifest = fake_docs
    (src / "library" / "os.rst.txt").write_text("os, patched by a security update")
    (src / "whatsnew.rst.txt").write_text("new page")
    with pytest.warns(CorpusDriftWarning) as caught:
        corpus = open_corpus("python-docs:installed")
    message = str(caught[0].message)
    assert "\n" not in message and len(caught) == 1
    # both versions named (the fake tree belongs to no Debian package), and what differs
    assert f"reads unknown package ({src})" in message and f"snapshot's ({manifest['made_from']})" in message
    assert "in 2 of 3 documents (library/os, whatsnew)" in message and "drop ':installed'" in message
    assert corpus.details["matches_snapshot"] is False and corpus.details["documents"] == 4
    assert [d.id for d in open_corpus("python-docs")] == ["about", "library/os.path", "library/os"]  # still pinned


def test_only_the_pinned_corpora_have_snapshots_or_an_installed_form(tmp_path):
    with pytest.raises(CorpusError, match="no snapshot is made of 'pydoc-topics'"):
        write_snapshot("pydoc-topics", tmp_path)
    with pytest.raises(CorpusError, match="unknown corpus 'pydoc-topics:installed'.*python-docs:installed"):
        open_corpus("pydoc-topics:installed")


def test_the_snapshot_is_read_once_per_process(monkeypatch, fake_docs):
    """Later reads reuse the checked documents (the capture reads its corpus several times)."""
    first = list(open_corpus("python-docs"))
    monkeypatch.setattr(corpus_module.lzma, "decompress", lambda *a, **k: pytest.fail("decompressed again"))
    assert list(open_corpus("python-docs")) == first
