"""``load_or_recapture``: chapter 10's measurement of the shipped checkpoints is kept under a hash of everything it
depends on, read back while nothing changed, and measured again when anything did (the measurement itself is
replaced by planted rows here; tests/integration/train/test_shipped.py measures for real)."""

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest

import qkplast.train.shipped as shipped
from qkplast.train.evaluate import MeasureSettings, load_full_run, window_kinds
from qkplast.train.shipped import COMPARED, compare_shipped, load_or_recapture, recapture_key, recapture_note

from tests.helpers import ROOT

FULL = ROOT / "data" / "miniature-full"


@pytest.fixture(scope="module")
def full():
    return load_full_run(FULL)


@pytest.fixture
def planted(full, monkeypatch, tmp_path):
    """``measure_shipped`` replaced by the committed seed-0 values plus a planted offset per row; each call logged."""
    calls = []
    table = full["table"]

    def measure(full_, out, settings=None, seed=0, only=None):
        calls.append({"settings": settings, "seed": seed, "only": only})
        rows = []
        names = only or sorted(table.branch[table.seed == seed].unique())[:2]
        for name in names:
            for kind in window_kinds(full_["config"]):
                theirs = table[(table.branch == name) & (table.window_kind == kind) & (table.seed == seed)].iloc[0]
                rows += [{"branch": name, "window_kind": kind, "quantity": q,
                          "recaptured": float(theirs[q]) + 1e-3 / 3 * (i + 1)} for i, q in enumerate(COMPARED)]
        return pd.DataFrame(rows)

    monkeypatch.setattr(shipped, "measure_shipped", measure)
    monkeypatch.setenv("QKPLAST_CACHE", str(tmp_path / "cache"))
    return calls, measure


def test_a_second_call_reads_back_the_same_table_without_measuring(full, planted, tmp_path):
    calls, measure = planted
    first = load_or_recapture(full)
    made = first.attrs["recapture"]
    assert len(calls) == 1 and not made["reused"]
    path = tmp_path / "cache" / "recapture" / made["path"].rsplit("/", 1)[-1]
    assert made["path"] == str(path) and path.exists()  # under $QKPLAST_CACHE
    second = load_or_recapture(full)
    assert len(calls) == 1 and second.attrs["recapture"]["reused"]
    pd.testing.assert_frame_equal(first, second, check_exact=True)  # bit for bit through the JSON file
    expected = compare_shipped(full, measure(full, None))
    pd.testing.assert_frame_equal(second, expected, check_exact=True)
    assert np.allclose(second.difference, second.recaptured - second.committed, rtol=0, atol=1e-15)
    assert recapture_note(first).startswith("measured on this machine")
    assert recapture_note(second).startswith("read back: measured on this machine") and path.name in recapture_note(second)


@pytest.mark.parametrize("change", ["settings", "seed", "only", "code", "torch", "threads", "cpu"])
def test_anything_the_measurement_depends_on_measures_again(full, planted, monkeypatch, change):
    calls, _ = planted
    kwargs = {}
    load_or_recapture(full)
    if change == "settings":
        kwargs["settings"] = MeasureSettings(docs=8)
    elif change == "seed":
        kwargs["seed"] = 1
    elif change == "only":
        kwargs["only"] = [sorted(full["table"].branch.unique())[0]]
    elif change == "code":
        monkeypatch.setattr(shipped, "source_digest", lambda: "another commit")
    elif change == "torch":
        import torch

        monkeypatch.setattr(torch, "__version__", "0.0.0")
    elif change == "threads":
        import torch

        monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    elif change == "cpu":
        from qkplast import provenance

        monkeypatch.setattr(provenance, "cpu", lambda: {"vendor_id": "GenuineIntel", "model name": "Intel Xeon"})
    again = load_or_recapture(full, **kwargs)
    assert len(calls) == 2 and not again.attrs["recapture"]["reused"]
    assert load_or_recapture(full, **kwargs).attrs["recapture"]["reused"] and len(calls) == 2


def test_the_key_follows_the_archives_bytes_not_its_path(full, tmp_path):
    copy = tmp_path / "full"
    shutil.copytree(FULL, copy)
    same = recapture_key(load_full_run(copy))
    assert same == recapture_key(full)  # a copy elsewhere is the same measurement
    with open(copy / shipped.SHIPPED, "ab") as f:
        f.write(b"\0")
    assert recapture_key(load_full_run(copy))["archive_sha256"] != same["archive_sha256"]


@pytest.mark.parametrize("damage", ["cut short", "another key", "not json"])
def test_a_damaged_cache_file_is_measured_again_and_written_over(full, planted, damage):
    calls, _ = planted
    path = load_or_recapture(full).attrs["recapture"]["path"]
    text = open(path).read()
    if damage == "cut short":
        text = text[: len(text) // 2]
    elif damage == "another key":
        record = json.loads(text)
        record["key"]["seed"] = 5
        text = json.dumps(record)
    else:
        text = "\x00\x01"
    with open(path, "w") as f:
        f.write(text)
    again = load_or_recapture(full)
    assert len(calls) == 2 and not again.attrs["recapture"]["reused"]
    assert json.loads(open(path).read())["key"] == recapture_key(full)  # repaired
    assert load_or_recapture(full).attrs["recapture"]["reused"]


def test_a_corpus_without_a_content_hash_is_measured_every_time(full, planted, tmp_path):
    calls, _ = planted
    config = full["config"]
    unpinned = {**full, "config": type(config).from_kwargs(config, corpus=str(tmp_path / "absent.jsonl"))}
    assert recapture_key(unpinned) is None
    first, second = load_or_recapture(unpinned), load_or_recapture(unpinned)
    assert len(calls) == 2 and first.attrs["recapture"]["path"] is None and not second.attrs["recapture"]["reused"]
    assert "not kept" in recapture_note(second)
    assert not (tmp_path / "cache").exists()  # nothing written


def test_a_local_corpus_file_is_keyed_by_its_content(full, tmp_path):
    config = full["config"]
    corpus = tmp_path / "local.jsonl"
    corpus.write_text('{"id": "a", "text": "one"}\n')
    local = {**full, "config": type(config).from_kwargs(config, corpus=str(corpus))}
    before = recapture_key(local)["corpora"]
    corpus.write_text('{"id": "a", "text": "two"}\n')
    assert recapture_key(local)["corpora"] != before


def test_a_cache_that_cannot_be_written_warns_and_still_returns_the_measurement(full, planted, tmp_path, monkeypatch):
    calls, _ = planted
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("QKPLAST_CACHE", str(tmp_path / "a-file" / "cache"))  # under a file: no folder can be made
    with pytest.warns(UserWarning, match="not kept: .*a-file.* cannot be written"):
        result = load_or_recapture(full)
    assert len(calls) == 1 and len(result) and result.attrs["recapture"]["path"] is None
    assert "QKPLAST_CACHE" in recapture_note(result) and np.isfinite(result.relative_to_sd).all()


def test_the_folder_keeps_the_newest_measurements_and_never_a_half_written_file(full, planted, tmp_path):
    calls, _ = planted
    folder = tmp_path / "cache" / "recapture"
    folder.mkdir(parents=True)
    old = [folder / f"{i:024x}.json" for i in range(shipped.KEEP_RECAPTURES + 3)]  # other commits' measurements
    for age, path in enumerate(old):
        path.write_text("{}")
        stamp = 1_700_000_000 + 60 * age  # old[0] the oldest
        os.utime(path, (stamp, stamp))
    writing = folder / ".abc.json.x1y2"  # another process's temporary, half written
    writing.write_text("{")
    other = folder / "notes.txt"
    other.write_text("not a measurement")
    made = load_or_recapture(full).attrs["recapture"]
    kept = sorted(p.name for p in folder.glob("*.json") if not p.name.startswith("."))
    newest_old = sorted(p.name for p in old[-(shipped.KEEP_RECAPTURES - 1):])
    assert len(calls) == 1 and kept == sorted(newest_old + [made["path"].rsplit("/", 1)[-1]])
    assert writing.exists() and other.exists()
    again = load_or_recapture(full)  # the new measurement survived its own pruning: read back
    assert len(calls) == 1 and again.attrs["recapture"]["reused"]


def test_pruning_skips_a_file_another_process_removed_first(tmp_path, monkeypatch):
    kept = tmp_path / "new.json"
    kept.write_text("{}")
    for i in range(4):  # 0.json the oldest, so it is among those removed
        (tmp_path / f"{i}.json").write_text("{}")
        os.utime(tmp_path / f"{i}.json", (1_700_000_000 + i, 1_700_000_000 + i))
    real_unlink = type(kept).unlink

    def racing_unlink(self, missing_ok=False):
        if self.name == "0.json":  # removed by another process between listing and removing
            real_unlink(self)
        return real_unlink(self, missing_ok)

    monkeypatch.setattr(type(kept), "unlink", racing_unlink)
    removed = shipped._prune(tmp_path, kept, newest=2)
    assert kept.exists() and len(list(tmp_path.glob("*.json"))) == 2
    assert tmp_path / "0.json" not in removed and len(removed) == 2
