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

import hashlib
import json
import tarfile
import tempfile
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from qkplast.provenance import machine, source_digest
from qkplast.train.data import prepare_data
from qkplast.train.evaluate import MeasureSettings, decisive_steps, measure_checkpoint, window_kinds
from qkplast.train.gates import early_checkpoint
from qkplast.train.hub import atomic_write, branch_name, branches, file_sha256, hub_cache, publish, repo_id

__all__ = ["COMPARED", "KEEP_RECAPTURES", "SHIPPED", "TOLERANCE", "compare_shipped", "load_or_recapture",
           "measure_shipped", "pack_folders", "recapture", "recapture_key", "recapture_note", "shipped_branches",
           "unpack_shipped"]

#: The shipped seed's archive in a committed full run.
SHIPPED = "seed0-checkpoints.tar.xz"

#: The largest recaptured difference allowed, in units of the seeds' standard deviation at the same checkpoint:
#: a difference below a twentieth of the variation the readings are about cannot move a reading.
TOLERANCE = 0.05

#: Recapture files kept in the cache folder, newest first: one per version of qkplast's code (about 14 KB each) on
#: this machine, so a checkout that moves between commits keeps its recent measurements and the folder stays small.
KEEP_RECAPTURES = 8

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


def measure_shipped(full: dict, out, settings: MeasureSettings | None = None, seed: int = 0,
                    only: list[str] | None = None) -> pd.DataFrame:
    """Measure the shipped checkpoints of a committed full run again: one row per (branch, window kind, quantity of
    :data:`COMPARED`) with its ``recaptured`` value (the arguments as :func:`recapture`'s)."""
    config = full["config"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = settings if settings is not None else _recorded_settings(full)
    prepare_data(config, out, progress=False)
    names = unpack_shipped(Path(full["path"]) / SHIPPED, out, seed)
    missing = sorted(set(only or ()) - set(names))
    if missing:
        raise ValueError(f"{', '.join(missing)} not shipped in {Path(full['path']) / SHIPPED}; shipped: {', '.join(names)}")
    rows = []
    for name in only or names:
        for kind, window in window_kinds(config).items():
            ours = measure_checkpoint(out, seed, name, window, settings, stage_window=config.window)
            rows += [{"branch": name, "window_kind": kind, "quantity": q, "recaptured": float(ours[q])} for q in COMPARED]
    return pd.DataFrame(rows)


def compare_shipped(full: dict, measured: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """:func:`measure_shipped`'s rows beside the committed table: ``committed`` (seed ``seed``'s value),
    ``seed_sd`` (the standard deviation over the run's seeds at the same checkpoint and window), ``difference``
    and ``relative_to_sd`` (``|difference| / seed_sd``)."""
    table = full["table"]
    table = table[table.branch.isin(measured.branch.unique())]
    long = table.melt(id_vars=["seed", "branch", "window_kind"], value_vars=list(COMPARED), var_name="quantity")
    spread = long.groupby(["branch", "window_kind", "quantity"]).value.std(ddof=1).rename("seed_sd")
    theirs = long[long.seed == seed].set_index(["branch", "window_kind", "quantity"]).value.rename("committed")
    result = measured.join(theirs, on=["branch", "window_kind", "quantity"]).join(
        spread, on=["branch", "window_kind", "quantity"])
    result = result[["branch", "window_kind", "quantity", "committed", "recaptured", "seed_sd"]]
    difference = result.recaptured - result.committed
    return result.assign(difference=difference, relative_to_sd=difference.abs() / result.seed_sd.replace(0, np.nan))


def _recorded_settings(full: dict) -> MeasureSettings:
    """The committed measurement settings (``full["provenance"]["measure_settings"]``), on the CPU."""
    recorded = {k: v for k, v in full["provenance"]["measure_settings"].items() if k != "device"}
    return MeasureSettings(**recorded)


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
    return compare_shipped(full, measure_shipped(full, out, settings, seed, only), seed)


#: The cache file's layout; a file of another format is measured again.
CACHE_FORMAT = 1


def _corpora_sha256(spec: str) -> dict | None:
    """Each part of a training corpus by content: a pinned snapshot's recorded content hash, a local file's sha256;
    None when a part has neither (a hub dataset): its measurement is never reused."""
    from qkplast.capture.corpus import CorpusError, read_manifest
    from qkplast.train.config import corpus_parts

    hashes = {}
    for part in corpus_parts(spec):
        try:
            hashes[part] = read_manifest(part)["content_sha256"]
        except (CorpusError, OSError, KeyError):
            if not Path(part).is_file():
                return None
            hashes[part] = file_sha256(Path(part))
    return hashes


def recapture_key(full: dict, settings: MeasureSettings | None = None, seed: int = 0,
                  only: list[str] | None = None) -> dict | None:
    """Everything a :func:`measure_shipped` value depends on, as a JSON-able dict: the archive's and the training
    corpora's content, the training config, the settings, ``seed`` and ``only``, qkplast's code, the numerical
    libraries' versions and the machine (:func:`qkplast.provenance.machine`). None when a corpus has no content hash."""
    import tokenizers
    import torch
    import transformers

    settings = settings if settings is not None else _recorded_settings(full)
    corpora = _corpora_sha256(full["config"].corpus)
    if corpora is None:
        return None
    return {"format": CACHE_FORMAT, "archive_sha256": file_sha256(Path(full["path"]) / SHIPPED),
            "corpora": corpora, "config": full["config"].to_dict(), "settings": asdict(settings), "seed": seed,
            "only": sorted(only) if only else None, "source_sha256": source_digest(),
            "versions": {"numpy": np.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                         "tokenizers": tokenizers.__version__},
            "machine": machine(settings.device)}


def _read_cached(path: Path, key: dict) -> dict | None:
    """The cache file's record when it holds a measurement under exactly ``key``; None otherwise (missing,
    unreadable, cut short, or another key: measured again and written over)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or not isinstance(record.get("rows"), list):
        return None
    return record


def _prune(folder: Path, kept: Path, newest: int = KEEP_RECAPTURES) -> list[Path]:
    """Remove all but the ``newest`` recapture files of ``folder`` (by modification time; ``kept`` always stays);
    return the removed. Another process's half-written file (a hidden temporary) is never touched, and a file
    another process removes first is skipped: a reader that loses its file measures again."""
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return float("inf")  # gone already: nothing to remove

    files = sorted((p for p in folder.glob("*.json") if not p.name.startswith(".") and p != kept), key=mtime,
                   reverse=True)
    removed = []
    for old in files[max(newest - 1, 0):]:
        try:
            old.unlink()
            removed.append(old)
        except OSError:
            pass
    return removed


def load_or_recapture(full: dict, settings: MeasureSettings | None = None, seed: int = 0,
                      only: list[str] | None = None, cache: Path | None = None) -> pd.DataFrame:
    """:func:`recapture`, measured once per machine: the measurement is kept in ``cache`` under a hash of
    :func:`recapture_key` and reused while nothing it depends on has changed.

    The same archive measured by the same code and libraries on the same CPU kind, with the same threads, gives the
    same numbers bit for bit; measuring again would only repeat them (about two minutes on two cores). Anything
    else (another commit of qkplast, another torch, another machine, other settings) gives another key, so it is
    measured again. A cache file that cannot be read is measured again and written over. The folder keeps the
    ``KEEP_RECAPTURES`` newest measurements.

    Parameters
    ----------
    cache : path, optional
        The cache folder (None: ``recapture/`` in qkplast's cache, :func:`qkplast.capture.models.cache_dir`).

    Returns
    -------
    DataFrame
        :func:`recapture`'s table; ``attrs["recapture"]`` says where the measurement is kept (or why it is
        ``not_kept``: a corpus without a content hash, a cache that cannot be written, with a warning), when it was
        made, how long it took and whether it was ``reused``.
    """
    from qkplast.capture.models import cache_dir

    settings = settings if settings is not None else _recorded_settings(full)  # resolved once: key and measurement
    key = recapture_key(full, settings, seed, only)
    path, reason = None, "a training corpus without a content hash"
    if key is not None:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        path = Path(cache if cache is not None else cache_dir() / "recapture") / f"{digest[:24]}.json"
    record = _read_cached(path, key) if path is not None else None
    reused = record is not None
    if record is None:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:
            measured = measure_shipped(full, scratch, settings, seed, only)
        record = {"key": key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "seconds": round(time.perf_counter() - t0, 1), "rows": measured.to_dict("records")}
        try:  # written whole, then renamed: a reader never sees half a file
            if path is not None:
                atomic_write(path, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))
                _prune(path.parent, path)
        except OSError as exc:  # a cache that cannot be written costs the next build a measurement, not this one
            path, reason = None, f"{path.parent} cannot be written ({exc.strerror or exc}; set QKPLAST_CACHE)"
            warnings.warn(f"the recapture is not kept: {reason}", stacklevel=2)
    result = compare_shipped(full, pd.DataFrame(record["rows"]), seed)
    result.attrs["recapture"] = {"path": str(path) if path else None, "measured_at": record["measured_at"],
                                 "seconds": record["seconds"], "reused": reused, "not_kept": None if path else reason}
    return result


def recapture_note(result: pd.DataFrame) -> str:
    """One line on a :func:`load_or_recapture` table: measured now or read back, when, in how long, and where it is
    kept."""
    made = result.attrs["recapture"]
    where = f"{Path(made['path']).name} in qkplast's cache" if made["path"] else f"not kept: {made['not_kept']}"
    verb = "read back: measured" if made["reused"] else "measured"
    return f"{verb} on this machine at {made['measured_at']} in {made['seconds']:.0f} s ({where})"
