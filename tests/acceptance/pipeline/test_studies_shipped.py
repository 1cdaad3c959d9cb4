"""The shipped studies as written: each file validated as shipped, and its first run rehearsed with tiny
stand-ins of the same architectures (random weights at a pinned commit in a local hub cache) at a short window
through the capture and analysis stages with ``qkplast study``; the thesis study's on the one-node SLURM
cluster, after its ``--dry-run`` script is checked.

The notebooks are the same code on every architecture and load a model only through
``qkplast.capture.models.load_for`` with the run's recorded options, the capture stage's own path (the recorded
tokenizer of SmolLM3's checkpoints included: tests/unit/pipeline/test_stages.py), so no study here executes them:
the README's thesis-scale commands execute every notebook once on a hub model's run
(tests/acceptance/test_rehearsal.py), and a study's job through the notebooks stage is
tests/integration/pipeline/test_stages_notebooks.py. The studies' files still carry the notebook parameters (the
tiny grids), which their validation checks against what the notebooks declare.

Only the model (its stand-in), the corpus (generated, in the study's own ``text_field``), the window, ``docs``,
the device and the resources are replaced; everything else (keys, revisions policy, analysis options, the rest
of the capture settings) is the shipped file's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.hub_fixtures import make_hub, repo_id, save_to_hub_cache, tiny_tokenizer
from qkplast.capture_format import open_capture
from qkplast.rundir.study_file import is_done, load_study
from tests.acceptance.test_public_series import SERIES
from tests.helpers import ROOT, TINY_NOTEBOOKS
from tests.unit.pipeline.test_studies_shipped import STUDIES, WINDOW, stand_in


PUBLIC_SERIES = {Path(series.file).stem for series in SERIES.values()}


def _mistral3():
    import torch
    import transformers as T

    torch.manual_seed(0)
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "rope_theta": 1e6,
            "llama_4_scaling_beta": 0.1}
    text = T.Ministral3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=32, vocab_size=300, max_position_embeddings=4096,
                              rope_parameters=rope)
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 16, "head_dim": 8}
    return T.Mistral3ForConditionalGeneration(T.Mistral3Config(text_config=text.to_dict(), vision_config=vision)).eval()


@pytest.fixture(scope="module")
def stand_in_hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("shipped")
    cache = root / "hub"
    commits = make_hub(cache, ("qwen3", "llama3", "smollm3", "mllama", "gpt_neox", "olmo2", "lucie"))
    commits["mistral3"] = save_to_hub_cache(_mistral3(), tiny_tokenizer(), repo_id("mistral3"), cache)
    return cache, commits, root


def _corpus(path: Path, text_field: str) -> Path:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    with path.open("w") as f:
        for i in range(4):
            f.write(json.dumps({"id": f"doc{i}", text_field: text[i * 20000: i * 20000 + 6000]}) + "\n")
    return path


def rehearsal_file(shipped: Path, hub, slurm: bool, notebooks: dict = TINY_NOTEBOOKS) -> Path:
    """The shipped study with its first run only, stand-ins substituted (see the module doc); ``notebooks``: the
    notebook parameters it carries (the tiny grids)."""
    cache, commits, root = hub
    data = yaml.safe_load(shipped.read_text())
    first = dict(data["models"][0])
    arch = stand_in(str(first["id"]))
    defaults = {**(data.get("defaults") or {}), **{k: v for k, v in first.items() if k not in ("id", "name", "resources")}}
    text_field = defaults.get("text_field", "text")
    first["id"] = f"{repo_id(arch)}@{commits[arch]}"
    for key in ("model", "revision", "seq_len", "bucket_size", "samples_per_bucket", "docs", "rope_scaling"):
        first.pop(key, None)
    if arch == "qwen3" and defaults.get("rope_scaling"):
        first["rope_scaling"] = defaults["rope_scaling"]  # YaRN kept: the tiny Qwen3 has 32768 positions
    data["models"] = [first]
    data["defaults"] = {**(data.get("defaults") or {}), **WINDOW, "device": "cpu", "dtype": "auto",
                        "corpus": str(_corpus(root / f"{shipped.stem}.jsonl", text_field))}
    data["defaults"].pop("rope_scaling", None)
    if defaults.get("tokenizer"):  # a base model's tokenizer (SmolLM3's checkpoints ship none): its stand-in's, pinned
        tok_arch = stand_in(str(defaults["tokenizer"]))
        data["defaults"]["tokenizer"] = f"{repo_id(tok_arch)}@{commits[tok_arch]}"
        first.pop("tokenizer", None)
    data["resources"] = ({"partition": "debug", "cpus": 1, "mem_gb": 2, "timeout_min": 30, "array_parallelism": 1,
                          "setup": ["export OMP_NUM_THREADS=1"]} if slurm else {"timeout_min": 30})
    data["out"] = str(root / f"out-{shipped.stem}")
    data["parameters"] = notebooks
    path = root / f"{shipped.stem}.rehearsal.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _env(cache: Path, **more) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **more}


def _qkplast(*argv, env, timeout=1800):
    return subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=timeout)


#: The public checkpoint series (pythia-160m, olmo2-1b-stage1, lucie-7b-extension, smollm3-checkpoints) are
#: rehearsed through capture and analysis by tests/acceptance/test_public_series.py, each run's capture checked
#: against its branch's commit (SmolLM3's through ``qkplast study`` itself); this file rehearses the others.
REHEARSED_HERE = [p for p in STUDIES if p.stem != "thesis" and p.stem not in PUBLIC_SERIES]


@pytest.mark.parametrize("shipped", REHEARSED_HERE, ids=[p.stem for p in REHEARSED_HERE])
def test_the_first_run_of_a_shipped_study_runs_through_every_stage(shipped, stand_in_hub):
    path = rehearsal_file(shipped, stand_in_hub, slurm=False)
    t0 = time.perf_counter()
    # through the architecture-specific stages, capture and analysis (the module doc says where the notebooks are)
    r = _qkplast("study", path, "--executor", "local", "--stage", "analyze", env=_env(stand_in_hub[0]))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert ": ok (" in r.stdout  # validated before it was submitted
    run = load_study(path).runs[0]
    assert is_done(run.run_dir, "analyze") and not is_done(run.run_dir, "notebooks")
    assert (run.run_dir / "capture.nc").exists() and (run.run_dir / "metrics.nc").exists()
    assert open_capture(run.run_dir / "capture.nc").attrs["tokenizer"] == run.capture.tokenizer
    print(f"{shipped.stem}: first run through stage analyze in {time.perf_counter() - t0:.0f} s")


def test_the_thesis_study_first_run_on_a_one_node_slurm_cluster(stand_in_hub, slurm):
    path = rehearsal_file(ROOT / "studies" / "thesis.yaml", stand_in_hub, slurm=True)
    env = _env(stand_in_hub[0], SLURM_CONF=str(slurm.conf))
    t0 = time.perf_counter()
    dry = _qkplast("study", path, "--executor", "slurm", "--dry-run", env=env, timeout=600)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    for line in ("#SBATCH --partition=debug", "#SBATCH --cpus-per-task=1", "#SBATCH --mem=2GB", "#SBATCH --time=30",
                 "export OMP_NUM_THREADS=1", "submitit.core._submit", "dry run: 1 run(s) validated, nothing submitted"):
        assert line in dry.stdout, line
    assert not (Path(yaml.safe_load(path.read_text())["out"]) / "study.json").exists()
    sub = _qkplast("study", path, "--executor", "slurm", "--stage", "analyze", env=env, timeout=600)
    assert sub.returncode == 0 and "submitted 1 job(s)" in sub.stdout, sub.stdout + sub.stderr
    state = json.loads((Path(yaml.safe_load(path.read_text())["out"]) / "study.json").read_text())
    job = next(iter(state["runs"].values()))
    assert state["resolved"][next(iter(state["runs"]))]["commit"] == stand_in_hub[1]["mistral3"]
    submitted = Path(job["stdout"]).parent / f"{job['job_id'].split('_')[0]}_submission.sh"
    deadline, lines = time.monotonic() + 1500, ""
    while time.monotonic() < deadline:
        lines = _qkplast("study", path, "--status", env=env, timeout=120).stdout
        if ": done" in lines or ": failed" in lines:
            break
        time.sleep(5)
    err = Path(job["stderr"]).read_text() if Path(job["stderr"]).exists() else ""
    assert ": done" in lines, lines + err[-3000:]
    if submitted.exists():  # the script SLURM ran is the one the dry run printed, but for the array's own paths
        script = submitted.read_text()
        assert "#SBATCH --partition=debug" in script and "export OMP_NUM_THREADS=1" in script
    assert "[capture] window 1 of 2" in err and "s/window" in err  # plain progress lines in the SLURM log
    run = load_study(path).runs[0]
    assert is_done(run.run_dir, "analyze") and not is_done(run.run_dir, "notebooks")
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["stage"] == "analyze" and (run.run_dir / "metrics.nc").exists()
    assert manifest["capture"]["text_field"] == run.capture.text_field
    print(f"thesis study, first run on SLURM: {time.perf_counter() - t0:.0f} s")
