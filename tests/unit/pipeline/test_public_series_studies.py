"""The public checkpoint series' study files as shipped: ids, branch names in training order, windows, tokenizer.

No model and no hub: these read the YAML through the study parser. The offline
rehearsals that run them are in ``tests/acceptance/test_public_series.py``.
"""

from __future__ import annotations

import math
import re

import pytest

from qkplast.rundir.study_file import load_study
from qkplast.results.crossrun import is_checkpoint_series

from tests.helpers import ROOT

STUDIES = ROOT / "studies"
SERIES = ("pythia-160m.yaml", "olmo2-1b-stage1.yaml", "lucie-7b-extension.yaml", "smollm3-checkpoints.yaml")


def _steps(study, pattern: str) -> list[int]:
    steps = []
    for run in study.runs:
        match = re.fullmatch(pattern, run.capture.revision)
        assert match, (run.name, run.capture.revision, pattern)
        steps.append(int(match.group(1)))
    return steps


@pytest.mark.parametrize("name", SERIES)
def test_every_series_is_one_model_at_branches_in_training_order(name):
    study = load_study(STUDIES / name)
    assert is_checkpoint_series(study) and len(study.runs) >= 5
    for run in study.runs:
        c = run.capture
        assert (c.device, c.dtype, c.samples_per_bucket, c.heads, c.seed) == ("cuda", "bfloat16", 1, 300, 0)
        assert c.seq_len // c.bucket_size == 16 and c.seq_len % c.bucket_size == 0, run.name
        assert c.text_field == "context" and c.corpus.startswith("hf:")
    assert study.resources["gpus"] == 1 and study.resources["max_num_timeout"] >= 1


def test_pythia_takes_log_spaced_steps_from_the_first_to_the_last():
    study = load_study(STUDIES / "pythia-160m.yaml")
    assert {r.capture.model for r in study.runs} == {"EleutherAI/pythia-160m"}
    steps = _steps(study, r"step(\d+)")
    assert steps[0] == 0 and steps[-1] == 143000 and steps == sorted(steps)
    later = [s for s in steps if s >= 1000]
    assert all(b / a <= 2.0 for a, b in zip(later, later[1:]))  # at most a doubling between neighbours
    assert all(s in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) or s % 1000 == 0 for s in steps[1:])  # published steps
    assert {r.capture.seq_len for r in study.runs} == {2048} and {r.capture.tokenizer for r in study.runs} == {None}


def test_olmo2_branch_names_follow_the_published_scheme():
    study = load_study(STUDIES / "olmo2-1b-stage1.yaml")
    assert {r.capture.model for r in study.runs} == {"allenai/OLMo-2-0425-1B"}
    for run in study.runs:
        step, tokens = map(int, re.fullmatch(r"stage1-step(\d+)-tokens(\d+)B", run.capture.revision).groups())
        assert tokens == math.ceil(step * 2**21 / 1e9), run.capture.revision  # 2^21 tokens a step, rounded up
        assert run.name == run.capture.revision
    steps = _steps(study, r"stage1-step(\d+)-tokens\d+B")
    assert steps[0] == 0 and steps == sorted(steps) and {r.capture.seq_len for r in study.runs} == {4096}


def test_lucie_runs_the_last_pretraining_checkpoint_then_the_extension():
    study = load_study(STUDIES / "lucie-7b-extension.yaml")
    first, *extension = study.runs
    assert first.capture.revision == "step0753851" and first.capture.seq_len == 4096
    steps = [int(re.fullmatch(r"extension_step(\d{7})", r.capture.revision).group(1)) for r in extension]
    assert steps == sorted(steps) and steps[-1] == 1220  # the extension's 1,220 steps (model card)
    assert {(r.capture.seq_len, r.capture.bucket_size) for r in extension} == {(32000, 2000)}


def test_smollm3_checkpoints_read_the_base_models_tokenizer():
    study = load_study(STUDIES / "smollm3-checkpoints.yaml")
    assert {r.capture.tokenizer for r in study.runs} == {"HuggingFaceTB/SmolLM3-3B"}
