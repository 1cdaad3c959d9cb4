"""Pin the named corpora by content: write the snapshots ``data/corpora/<name>.tar.xz`` and their manifests.

``python-docs`` is made from the installed CPython documentation sources (Debian's ``python3-doc``), ``stdlib-code``
from the running interpreter's standard library; each archive holds the documents exactly as
``open_corpus("<name>:installed")`` yields them, and its manifest records the source's version, every document's id
and sha256 and the content hash that ``open_corpus("<name>")`` checks. Regenerating from the same installed files
gives the same bytes (sorted members, fixed mtimes and owners), so ``--check`` can tell whether the committed
snapshot is what this machine would make.

    .venv/bin/python scripts/make_corpus_snapshot.py                  # both corpora, into data/corpora
    .venv/bin/python scripts/make_corpus_snapshot.py python-docs      # one of them
    .venv/bin/python scripts/make_corpus_snapshot.py --check          # exit 1 when a regenerated one differs

A new snapshot changes what the default run and chapter 10 read: the notebooks' committed outputs must then be
regenerated.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from qkplast.capture.corpus import PINNED_CORPORA, CorpusError, write_snapshot

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"the corpora to pin, of {', '.join(PINNED_CORPORA)} (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "corpora", help="folder (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary folder and compare with --out, writing nothing")
    args = parser.parse_args(argv)
    names = args.names or list(PINNED_CORPORA)
    unknown = [name for name in names if name not in PINNED_CORPORA]
    if unknown:
        parser.error(f"no snapshot is made of {', '.join(unknown)}; choose among {', '.join(PINNED_CORPORA)}")
    try:
        if args.check:
            return _check(names, args.out)
        for name in names:
            manifest = write_snapshot(name, args.out)
            _report(name, manifest, args.out)
    except CorpusError as exc:
        print(f"make_corpus_snapshot: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _report(name: str, manifest: dict, folder: Path) -> None:
    size = (folder / manifest["archive"]).stat().st_size
    print(f"{name}: {manifest['n_documents']} documents, {manifest['text_bytes'] / 1e6:.1f} MB of text from "
          f"{manifest['made_from']} -> {folder / manifest['archive']} ({size / 1e6:.2f} MB), "
          f"content sha256 {manifest['content_sha256']}")


def _check(names: list[str], folder: Path) -> int:
    differ = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            manifest = write_snapshot(name, Path(tmp))
            for file in (manifest["archive"], f"{name}.json"):
                same = (folder / file).is_file() and (folder / file).read_bytes() == (Path(tmp) / file).read_bytes()
                print(f"{folder / file}: {'identical to' if same else 'DIFFERS from'} the one made from "
                      f"{manifest['made_from']}")
                differ += [] if same else [file]
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
