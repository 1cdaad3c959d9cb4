"""Resumable parts: every finished document of a capture written atomically, reused by a rerun.

With an output path ``OUT``, every finished document is written atomically to
``OUT.parts/doc-NNNNNN.nc`` next to ``manifest.json`` (the run's options,
model provenance and library versions). A run started again with the same
manifest reuses the parts and continues; a different manifest is refused
unless ``overwrite``. ``OUT`` is written atomically at the end
(:func:`qkplast.capture_format.save_capture`), then the parts are removed; an existing
``OUT`` is never replaced without ``overwrite``. A run that fails (an error,
NaN in a vector, a kill) leaves the parts of the documents it finished. The
last document goes straight into ``OUT`` (its part would be written only to
be deleted a moment later); if ``OUT`` cannot be written, its part is written
then, so a rerun recomputes nothing. Only a kill during that final write
costs the last document again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import xarray as xr

from qkplast.capture_format import CaptureError, open_dataset, save_dataset

__all__ = ["PartStore", "check_output", "output_lock"]

_MANIFEST = "manifest.json"
_PART = "doc-{:06d}.nc"


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an output that exists (without ``overwrite``), is a directory, or cannot be created."""
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (CLI: --overwrite) to replace it")
    if out.is_dir():
        raise IsADirectoryError(f"output {out} is a directory")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"output directory {out.parent} does not exist")
    # Creating a file is the only reliable test: permission bits do not stop root, nor reveal read-only mounts.
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=out.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PermissionError(f"output directory {out.parent} is not writable ({exc.strerror})") from exc


@contextlib.contextmanager
def output_lock(out: Path | None):
    """Hold an exclusive lock on capture file ``out`` (``.OUT.lock`` beside it) while the block runs.

    A second capture into the same file, from this host or another sharing the file system, is refused
    at once with a one-line :class:`CaptureError` instead of writing parts or the file beside the first.
    The lock is the operating system's (``flock``): a killed process releases it. The lock file is removed
    on release (a lock taken on a file already unlinked by its previous holder is retaken on the new one),
    so a finished or failed capture leaves nothing beside its output. Nothing is locked when ``out`` is None.
    """
    if out is None:
        yield
        return
    out = Path(out)
    if not out.parent.is_dir():
        raise FileNotFoundError(f"output directory {out.parent} does not exist")
    path = out.parent / f".{out.name}.lock"
    handle = _acquire(path, out)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        handle.close()  # closing releases the lock


def _acquire(path: Path, out: Path):
    import fcntl

    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise CaptureError(f"another capture is writing {out} ({holder}); wait for it to finish (a rerun then "
                               "reuses its result) or choose another output") from None
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()  # the previous holder removed this file after we opened it: lock the current one
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
    handle.flush()
    return handle


def _write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    os.replace(tmp, path)


class PartStore:
    """The ``OUT.parts`` directory of one capture, or nothing at all when ``out`` is None.

    Parameters
    ----------
    out : Path or None
        The capture file; parts go to ``OUT.parts/``.
    manifest : dict
        What must match for parts to be reused (JSON-serialisable).
    overwrite : bool
        Discard parts written under another manifest instead of refusing.
    """

    def __init__(self, out: Path | None, manifest: dict, overwrite: bool):
        self.dir = None if out is None else out.with_name(out.name + ".parts")
        if self.dir is not None:
            self._prepare(manifest, overwrite)

    def _prepare(self, manifest: dict, overwrite: bool) -> None:
        parts = self.dir
        if parts.exists():
            try:
                previous = json.loads((parts / _MANIFEST).read_text())
            except (OSError, json.JSONDecodeError):
                previous = None
            if previous != manifest:
                if not overwrite:
                    changed = (
                        sorted(k for k in manifest.keys() | previous.keys() if manifest.get(k) != previous.get(k))
                        if isinstance(previous, dict)
                        else ["<unreadable manifest>"]
                    )
                    raise CaptureError(
                        f"{parts} holds a partial capture made with different arguments (differing: {changed}); "
                        "rerun with the same arguments to resume, or pass overwrite=True (CLI: --overwrite) to "
                        "discard it"
                    )
                shutil.rmtree(parts)
        parts.mkdir(exist_ok=True)
        for stale in parts.glob("*.tmp"):
            stale.unlink()  # left by a run killed while writing
        _write_json_atomic(parts / _MANIFEST, manifest)

    def load(self, index: int, doc_id: str) -> xr.Dataset | None:
        """The finished part of window ``index``, or None; refuses a part of another document."""
        if self.dir is None:
            return None
        part = self.dir / _PART.format(index)
        if not part.exists():
            return None
        piece = open_dataset(part)
        if piece.attrs.get("doc") != doc_id:
            raise CaptureError(
                f"{part} holds document {piece.attrs.get('doc')!r} but the corpus now gives {doc_id!r} at that "
                "index: the corpus changed since the interrupted run; pass --overwrite to start over"
            )
        return piece

    def save(self, index: int, piece: xr.Dataset) -> None:
        """Write window ``index`` atomically (nothing when there is no output)."""
        if self.dir is not None:
            save_dataset(piece, self.dir / _PART.format(index))

    def remove(self) -> None:
        """Delete the parts (after the final capture is written, or when nothing was captured)."""
        if self.dir is not None and self.dir.exists():
            shutil.rmtree(self.dir)
