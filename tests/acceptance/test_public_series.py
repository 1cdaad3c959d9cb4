"""The public checkpoint series' study files, validated as shipped and rehearsed offline through capture and analysis.

For each of ``studies/pythia-160m.yaml``, ``olmo2-1b-stage1.yaml``,
``lucie-7b-extension.yaml`` and ``smollm3-checkpoints.yaml``, a tiny random model
of the same architecture is saved in a local Hugging Face hub cache (``HF_HOME``
in a temporary directory) under the study's own repository id and branch names,
as many branches as are rehearsed, and, where the study names a tokenizer, the
tokenizer's repository at the named revision. SmolLM3's checkpoint branches are
saved without a tokenizer, as they are published.

The shipped file is loaded as is (:func:`qkplast.pipeline.study.load_study`);
the rehearsal writes a copy that changes only :data:`OVERRIDES` (what cannot run
here: LongBench-Pro and a GPU) and, for a run whose window exceeds
:data:`MAX_SEQ_LEN`, the window (16 buckets kept), keeps the study's first run(s),
validates that copy the same way, and runs those runs to the ``analyze`` stage with
the job's own function (:func:`qkplast.pipeline.study.execute_run`, the call a
submitit job makes); the SmolLM3 series goes through ``qkplast study COPY
--executor local --stage analyze`` itself. Samples per bucket, heads, seed, dtype,
the tokenizer and every window up to 4096 stay as shipped. The shipped window of a
shortened run is checked by the planner instead (config limit, windows the corpus
yields), without a forward pass: a 32000-token forward costs 15 s here even for
the tiny model (sdpa's work grows as the square of the window), four of them a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest
import yaml


from tests.hub_fixtures import long_corpus, save_to_hub_cache, tiny_model, tiny_tokenizer  # noqa: E402
from qkplast.capture.models import split_revision  # noqa: E402
from qkplast.capture.plan import plan_capture  # noqa: E402
from qkplast.capture_format import open_capture, open_dataset  # noqa: E402
from qkplast.pipeline.study import execute_run  # noqa: E402
from qkplast.rundir.study_file import is_done, load_study  # noqa: E402
from tests.helpers import ROOT

pytestmark = pytest.mark.acceptance

STUDIES = ROOT / "studies"


@dataclass(frozen=True)
class Series:
    """A shipped study and its stand-in: the tiny architecture, how many first runs are rehearsed, and per-branch
    config changes (a branch trained at another window or RoPE base than the architecture's default)."""

    file: str
    arch: str
    rehearsed: int = 1
    branch_config: dict = field(default_factory=dict)
    branches_ship_tokenizer: bool = True


SERIES = {
    "pythia": Series("pythia-160m.yaml", "gpt_neox"),
    "olmo2": Series("olmo2-1b-stage1.yaml", "olmo2"),
    # the pre-extension checkpoint at its own 4096 positions and RoPE base 500,000, then the first extension branch
    "lucie": Series("lucie-7b-extension.yaml", "lucie", rehearsed=2, branch_config={
        "step0753851": {"max_position_embeddings": 4096,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}}),
    "smollm3": Series("smollm3-checkpoints.yaml", "smollm3", branches_ship_tokenizer=False),
}

#: What the rehearsal changes in a shipped study, and nothing else: a local corpus of two long documents instead of
#: LongBench-Pro's 500 (with the study's own ``text_field``), and the CPU instead of a GPU.
OVERRIDES = {"docs": 2, "device": "cpu"}
RESOURCE_OVERRIDES = {"gpus": 0}
#: Longest window rehearsed through a forward pass; a longer one is rehearsed at this length, 16 buckets kept.
MAX_SEQ_LEN = 4096


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """``HF_HOME`` with every rehearsed branch (and named tokenizer) of every series; ``{(repo, rev): commit}``."""
    root = tmp_path_factory.mktemp("public-series")
    home = root / "hf"
    corpus = long_corpus(root / "long.jsonl", n_chars=150_000, text_field="context")  # > 32000 tokens each
    tokenizer, commits = tiny_tokenizer(), {}
    for series in SERIES.values():
        for run in load_study(STUDIES / series.file).runs[:series.rehearsed]:
            model = tiny_model(series.arch, **series.branch_config.get(run.capture.revision, {}))
            with_tokenizer = tokenizer if series.branches_ship_tokenizer else None
            commits[run.capture.model, run.capture.revision] = save_to_hub_cache(
                model, with_tokenizer, run.capture.model, home / "hub", run.capture.revision)
            if run.capture.tokenizer:
                repo, revision = split_revision(run.capture.tokenizer)
                commits[repo, revision or "main"] = save_to_hub_cache(None, tokenizer, repo, home / "hub",
                                                                      revision or "main")
    return home, corpus, commits


@pytest.fixture
def hf_home(hub, monkeypatch):
    """Point huggingface_hub (read at call time) at the rehearsal's HF_HOME."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(hub[0]))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub[0] / "hub"))
    return hub


def _rehearsal_copy(series: Series, corpus: Path, out: Path) -> Path:
    """The shipped study with :data:`OVERRIDES` and its first runs only, written beside ``out``."""
    raw = yaml.safe_load((STUDIES / series.file).read_text())
    raw["defaults"] = {**raw["defaults"], **OVERRIDES, "corpus": str(corpus)}
    raw["resources"] = {**raw["resources"], **RESOURCE_OVERRIDES}
    raw["models"] = [dict(entry) for entry in raw["models"][:series.rehearsed]]
    for entry in raw["models"]:
        if entry.get("seq_len", raw["defaults"].get("seq_len")) > MAX_SEQ_LEN:
            entry.update(seq_len=MAX_SEQ_LEN, bucket_size=MAX_SEQ_LEN // 16)
    raw["out"] = str(out)
    path = out.parent / f"rehearsal-{series.file}"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _changed(shipped, rehearsed) -> set[str]:
    """Capture options that differ between a shipped run and its rehearsal."""
    a, b = shipped.capture.to_dict(), rehearsed.capture.to_dict()
    return {k for k in a if a[k] != b[k]}


def _overridden(shipped) -> set[str]:
    """What :func:`_rehearsal_copy` may change in a shipped run."""
    window = {"seq_len", "bucket_size"} if shipped.capture.seq_len > MAX_SEQ_LEN else set()
    return {"corpus", "docs", "device"} | window


def _check_run(spec, commits, series: Series) -> None:
    ds = open_capture(spec.run_dir / "capture.nc")
    attrs = ds.attrs
    assert (attrs["model"], attrs["revision"]) == (spec.capture.model, spec.capture.revision)
    assert attrs["commit"] == commits[spec.capture.model, spec.capture.revision]
    assert (attrs["seq_len"], attrs["bucket_size"], attrs["dtype"]) == (
        spec.capture.seq_len, spec.capture.bucket_size, spec.capture.dtype)
    assert attrs["family_verified"] is True and attrs["n_docs"] == 2
    assert attrs["tokenizer"] == spec.capture.tokenizer
    manifest = json.loads((spec.run_dir / "manifest.json").read_text())
    assert manifest["capture"]["tokenizer"] == spec.capture.tokenizer and manifest["status"] == "ok"
    assert manifest["commit"] == attrs["commit"]
    for run_dir in (spec.run_dir, spec.run_dir / "code"):  # the run's capture and the code capture, both analysed
        metrics = open_dataset(run_dir / "metrics.nc")
        assert metrics.sizes["head"] == ds.sizes["head"] and np.isfinite(metrics.bias_strength.values).all()


@pytest.mark.parametrize("key", ["pythia", "olmo2", "lucie"])
def test_public_series_study_is_rehearsed_through_capture_and_analysis(key, hf_home, tmp_path):
    home, corpus, commits = hf_home
    series = SERIES[key]
    shipped = load_study(STUDIES / series.file)
    copy = load_study(_rehearsal_copy(series, corpus, tmp_path / "runs"))
    for before, after in zip(shipped.runs, copy.runs):
        assert (before.name, before.id) == (after.name, after.id)
        assert _changed(before, after) == _overridden(before)
        if before.capture.seq_len > MAX_SEQ_LEN:  # the shipped window, planned on the stand-in branch
            plan = plan_capture(replace(before.capture, corpus=str(corpus), docs=2, device="cpu"),
                                device_memory_gb=80).check()
            assert plan.windows == 2 and plan.options.seq_len // plan.options.bucket_size == 16
    for spec in copy.runs:
        execute_run(spec, "analyze")
        _check_run(spec, commits, series)
    first = open_capture(copy.runs[0].run_dir / "capture.nc")
    if key == "pythia":  # GPT-NeoX: a quarter of each head rotates, recorded beside the vectors
        assert first.attrs["model_family"] == "gpt_neox" and first.rotary.values.sum() == first.sizes["dim"] // 4
    if key == "olmo2":
        assert first.attrs["model_family"] == "olmo2"
    if key == "lucie":  # before the extension at 4096 positions and base 500,000; after it at base 20M
        extended = open_capture(copy.runs[1].run_dir / "capture.nc")
        assert first.attrs["rope_parameters"]["rope_theta"] == 5e5 and first.attrs["max_position_embeddings"] == 4096
        assert extended.attrs["rope_parameters"]["rope_theta"] == 2e7
        assert extended.attrs["max_position_embeddings"] == 32000 == shipped.runs[1].capture.seq_len


def test_smollm3_checkpoints_take_the_base_tokenizer_and_run_as_a_study(hf_home, tmp_path, capsys):
    """The branches ship no tokenizer: refused without the option (one line, naming it), read with it, and the
    shipped study's first run goes through ``qkplast study --executor local --stage analyze``."""
    from qkplast.capture.models import ModelError, load_tokenizer
    from qkplast.pipeline.cli import main

    home, corpus, commits = hf_home
    series = SERIES["smollm3"]
    shipped = load_study(STUDIES / series.file)
    first = shipped.runs[0]
    assert {r.capture.tokenizer for r in shipped.runs} == {"HuggingFaceTB/SmolLM3-3B"}
    with pytest.raises(ModelError, match="--tokenizer") as info:
        load_tokenizer(first.capture.model, revision=first.capture.revision)
    assert "\n" not in str(info.value)
    plan = ["plan", "--model", first.id, "--corpus", str(corpus), "--text-field", "context", "--docs", "2",
            "--seq-len", str(first.capture.seq_len), "--bucket-size", str(first.capture.bucket_size),
            "--device", "cpu", "--samples-per-bucket", "1"]
    assert main(plan) == 2 and "--tokenizer" in capsys.readouterr().err
    assert main(plan + ["--tokenizer", first.capture.tokenizer]) == 0 and "fits" in capsys.readouterr().out

    copy_path = _rehearsal_copy(series, corpus, tmp_path / "runs")
    copy = load_study(copy_path)
    assert _changed(first, copy.runs[0]) == _overridden(first)
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", "study", str(copy_path), "--executor", "local",
                           "--stage", "analyze"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert ": ok (" in done.stdout  # validated before it was submitted
    spec = copy.runs[0]
    _check_run(spec, commits, series)
    assert is_done(spec.run_dir, "analyze") and not is_done(spec.run_dir, "notebooks")
    attrs = open_capture(spec.run_dir / "capture.nc").attrs
    assert attrs["tokenizer_commit"] == commits["HuggingFaceTB/SmolLM3-3B", "main"]
    assert json.loads((spec.run_dir / "study-done.json").read_text())["stage"] == "analyze"
