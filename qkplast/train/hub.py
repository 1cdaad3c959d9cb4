"""Checkpoints as branches of a local Hugging Face hub cache, readable offline as a public series would be.

``DIR/hf`` is an ``HF_HOME``; its hub cache ``DIR/hf/hub`` holds one repository per seed,
``qkplast/miniature-seed{S}``, in the layout ``huggingface_hub`` reads::

    models--qkplast--miniature-seed0/
        blobs/<sha256 of the file>
        snapshots/<commit>/<file> -> ../../blobs/<sha256>
        refs/<branch>                       # the commit the branch points to

so ``HF_HOME=DIR/hf qkplast capture --model qkplast/miniature-seed0@stageA-step30`` resolves the branch through
``refs/`` to a commit exactly as for a download. The commit is a 40-hex digest of the file names and contents,
fixed for fixed weights. A branch is written blob first, snapshot next and ref last, each by an atomic rename,
so a training killed while writing leaves no branch that points at an incomplete checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from qkplast.train.config import TrainConfigError

__all__ = ["OWNER", "atomic_write", "branch_name", "branches", "file_sha256", "hub_cache", "publish", "repo_id",
           "snapshot"]

OWNER = "qkplast"


def repo_id(seed: int) -> str:
    """``qkplast/miniature-seed{seed}``."""
    return f"{OWNER}/miniature-seed{seed}"


def branch_name(arm: str, step: int) -> str:
    """``stageA-step{N}`` for stage A, ``ext-{arm}-step{N}`` for an extension arm (N from the extension's start)."""
    return f"stageA-step{step}" if arm == "stageA" else f"ext-{arm}-step{step}"


def hub_cache(out) -> Path:
    """The hub cache of training directory ``out`` (``HF_HOME=out/hf``)."""
    return Path(out) / "hf" / "hub"


def _repo_dir(cache: Path, repo: str) -> Path:
    return Path(cache) / f"models--{repo.replace('/', '--')}"


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` then rename onto ``path``: readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def publish(folder: Path, cache: Path, repo: str, branch: str) -> str:
    """Add the files of checkpoint directory ``folder`` to ``cache`` as ``repo`` at ``branch``; return the commit."""
    root = _repo_dir(cache, repo)
    files = {p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(Path(folder).rglob("*")) if p.is_file()}
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(f"{name}\0{files[name]}\n".encode())
    commit = digest.hexdigest()
    for name, sha in files.items():
        blob = root / "blobs" / sha
        if not blob.exists():
            atomic_write(blob, lambda tmp, src=Path(folder) / name: shutil.copyfile(src, tmp))
        link = root / "snapshots" / commit / name
        target = os.path.relpath(blob, link.parent)  # relative, as huggingface_hub writes them

        def make_link(tmp, target=target):
            tmp.unlink()
            os.symlink(target, tmp)

        atomic_write(link, make_link)
    atomic_write(root / "refs" / branch, lambda tmp: tmp.write_text(commit))
    return commit


def branches(cache: Path, repo: str) -> dict[str, str]:
    """``{branch: commit}`` of ``repo`` in ``cache`` (empty when the repository is absent)."""
    refs = _repo_dir(cache, repo) / "refs"
    return {p.name: p.read_text().strip() for p in sorted(refs.glob("*"))} if refs.is_dir() else {}


def snapshot(cache: Path, repo: str, branch: str) -> Path:
    """The snapshot directory ``branch`` of ``repo`` points to (a checkpoint directory transformers loads)."""
    commit = branches(cache, repo).get(branch)
    if commit is None:
        raise TrainConfigError(f"no branch {branch!r} of {repo!r} in {cache}; train it first (qkplast train)")
    return _repo_dir(cache, repo) / "snapshots" / commit
