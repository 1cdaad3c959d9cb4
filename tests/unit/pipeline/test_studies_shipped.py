"""The shipped studies as written: each file is valid as shipped (keys, resources, revisions policy), every
architecture in it has a tiny rehearsal stand-in, and a floating study says how to pin it. The rehearsals of
each study's first run through every stage are in tests/acceptance/pipeline/test_studies_shipped.py."""

from __future__ import annotations

import pytest
import yaml

from qkplast.rundir.study_file import load_study
from tests.helpers import ROOT

#: the capture studies, those with ``models:`` (a training study, with a top-level ``train:``, is qkplast train's:
#: tests/*/train; chapter 10's registration and pilots are read by qkplast.train: tests/unit/train)
STUDIES = sorted(p for p in (ROOT / "studies").glob("*.yaml") if "models" in yaml.safe_load(p.read_text()))
#: The architecture of each shipped id (by prefix), so its stand-in is a tiny model of the same family.
STAND_INS = {"mistralai/Ministral-3": "mistral3", "Qwen/Qwen3": "qwen3", "meta-llama/Llama-3.2-11B-Vision": "mllama",
             "meta-llama/Llama": "llama3", "mistral-community/Mistral-7B": "llama3",
             "HuggingFaceTB/SmolLM3": "smollm3", "smollm2-135m": "llama3", "EleutherAI/pythia": "gpt_neox",
             "allenai/OLMo-2": "olmo2", "OpenLLM-France/Lucie": "lucie"}
WINDOW = {"seq_len": 512, "bucket_size": 32, "samples_per_bucket": 4, "docs": 2}


def stand_in(model_id: str) -> str:
    for prefix, arch in STAND_INS.items():
        if model_id.startswith(prefix):
            return arch
    raise AssertionError(f"no tiny stand-in for {model_id!r}: add its architecture to STAND_INS")


@pytest.mark.parametrize("shipped", STUDIES, ids=[p.stem for p in STUDIES])
def test_each_shipped_study_is_valid_as_shipped(shipped):
    study = load_study(shipped)  # keys, resources, revisions policy, names: as a submission reads it
    assert study.runs and study.out.name == study.name
    for run in study.runs:
        stand_in(run.capture.model)  # every architecture has a rehearsal stand-in
    text = shipped.read_text()
    if study.allow_floating:  # a floating study says how to pin it
        assert "pin" in text and "--validate" in text, shipped.name
