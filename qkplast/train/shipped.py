"""The full run's shipped checkpoints measured again on this machine (issue 36).

The committed full run (``data/miniature-full/``) was trained and measured on a GPU. Seed 0's decisive checkpoints
travel with it in float16 (``seed0-checkpoints.tar.xz``, :data:`SHIPPED`); a reader on a CPU checks the committed
table by measuring them again: the training data are rebuilt from the pinned corpora
(:func:`qkplast.train.data.prepare_data`, deterministic), each shipped checkpoint becomes a branch of a local hub
cache, and :func:`qkplast.train.evaluate.measure_checkpoint` measures it at both windows with the committed
settings, on this machine's device.

What may differ, and why: the weights were rounded to float16 for shipping (a relative error of at most
``2**-11``), and the GPU's float32 kernels sum in another order than the CPU's. The comparison states each
difference beside the spread of the same quantity over the run's seeds at the same checkpoint, the variation the
readings are about.
"""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from qkplast.train.data import prepare_data
from qkplast.train.evaluate import MeasureSettings, decisive_steps, measure_checkpoint, window_kinds
from qkplast.train.gates import early_checkpoint
from qkplast.train.hub import branch_name, branches, hub_cache, publish, repo_id

__all__ = ["COMPARED", "SHIPPED", "TOLERANCE", "pack_folders", "recapture", "shipped_branches", "unpack_shipped"]

#: The shipped seed's archive in a committed full run.
SHIPPED = "seed0-checkpoints.tar.xz"

#: The largest recaptured difference allowed, in units of the seeds' standard deviation at the same checkpoint:
#: a difference below a twentieth of the variation the readings are about cannot move a reading.
TOLERANCE = 0.05

#: The quantities compared: what the gates and the readings read.
COMPARED = ("loss", "in_context_gain", "copy_loss", "sink_ratio", "abs_bias_strength", "abs_alpha_k", "ap_first20",
            "ap_drop")


def shipped_branches(config, table, unigram: float, seed: int) -> list[str]:
    """The branches of ``seed`` a reader recaptures: its "early" checkpoint (the event of the registration), the
    checkpoints the gates are read at (:func:`qkplast.train.evaluate.decisive_steps`: the branch, stage A's end,
    each arm's end). All 25 of a seed would be 40 MiB (float16 weights compress by about 10%), more than the
    repository should carry for a check a reader runs on a few."""
    wanted = {(arm, step) for arm, steps in decisive_steps(config).items() for step in steps}
    early = early_checkpoint(table, unigram).get(seed)
    if early is not None and early == early:  # NaN: the seed never left the plateau
        wanted.add(("stageA", int(early)))
    return sorted(branch_name(arm, step) for arm, step in wanted)


def pack_folders(staging: Path, path: Path, names) -> None:
    """The folders ``names`` of ``staging`` as one .tar.xz, byte-stable (sorted, times and owners zeroed)."""
    # preset 1: float16 weights gain about 10% at any preset (random fp16, 34.3 MiB: 30.8 at 6 and 9 in 32 s, 31.2 at 1 in 23 s)
    with tarfile.open(path, "w:xz", preset=1) as tar:
        for item in sorted(p for name in names for p in [staging / name, *(staging / name).rglob("*")]):
            info = tar.gettarinfo(str(item), arcname=str(item.relative_to(staging)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if item.is_file():
                with open(item, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def unpack_shipped(archive, out, seed: int = 0) -> list[str]:
    """Publish every checkpoint folder of ``archive`` as a branch of ``seed`` in ``out``'s hub cache; its names."""
    out = Path(out)
    with tempfile.TemporaryDirectory(dir=out) as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
        names = sorted(p.name for p in Path(tmp).iterdir() if p.is_dir())
        known = branches(hub_cache(out), repo_id(seed))
        for name in names:
            if name not in known:
                publish(Path(tmp) / name, hub_cache(out), repo_id(seed), name)
    return names


def recapture(full: dict, out, settings: MeasureSettings | None = None, seed: int = 0,
              only: list[str] | None = None) -> pd.DataFrame:
    """Measure the shipped checkpoints of a committed full run again and compare them with its table.

    Parameters
    ----------
    full : dict
        :func:`qkplast.train.evaluate.load_full_run`'s value; its ``path`` holds :data:`SHIPPED`.
    out : path
        A working directory: the rebuilt training data and the hub cache of the shipped checkpoints.
    settings : MeasureSettings, optional
        The committed measurement settings (``full["provenance"]["measure_settings"]``) on the CPU when None.
    only : list of str, optional
        Measure only these shipped branches (None: every one).

    Returns
    -------
    DataFrame
        One row per (branch, window kind, quantity of :data:`COMPARED`): ``committed``, ``recaptured``,
        ``difference`` and ``seed_sd``, the standard deviation of the committed value over the run's seeds at the
        same checkpoint and window.
    """
    config, table = full["config"], full["table"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if settings is None:
        recorded = {k: v for k, v in full["provenance"]["measure_settings"].items() if k != "device"}
        settings = MeasureSettings(**recorded)
    prepare_data(config, out, progress=False)
    names = unpack_shipped(Path(full["path"]) / SHIPPED, out, seed)
    missing = sorted(set(only or ()) - set(names))
    if missing:
        raise ValueError(f"{', '.join(missing)} not shipped in {Path(full['path']) / SHIPPED}; shipped: {', '.join(names)}")
    rows = []
    for name in only or names:
        for kind, window in window_kinds(config).items():
            ours = measure_checkpoint(out, seed, name, window, settings, stage_window=config.window)
            same = table[(table.branch == name) & (table.window_kind == kind)]
            theirs = same[same.seed == seed].iloc[0]
            for q in COMPARED:
                rows.append({"branch": name, "window_kind": kind, "quantity": q, "committed": float(theirs[q]),
                             "recaptured": float(ours[q]), "seed_sd": float(same[q].std(ddof=1))})
    result = pd.DataFrame(rows)
    return result.assign(difference=result.recaptured - result.committed,
                         relative_to_sd=(result.recaptured - result.committed).abs() / result.seed_sd.replace(0, np.nan))
