"""Issue 23, the thesis-scale path without a GPU: the code capture sized to its corpus, the memory plan
(refusal, float32 upcasts, LM-head chunks, several GPUs), studies validated before submission (SLURM keys and
dry run, pinned and floating revisions, the commit a requeued job checks), local jobs one GPU each, progress
lines, and the GPU cache emptied before the notebooks."""

from __future__ import annotations

import json
import os


from tests.helpers import ROOT
from tests.helpers import study_yaml
from tests.helpers import tiny_tokenizer



# --------------------------------------------------------------------------- 1. the code capture


# --------------------------------------------------------------------------- 7. memory


# --------------------------------------------------------------------------- 5, 6, 9. studies


# --------------------------------------------------------------------------- 4. local jobs on a GPU host


# --------------------------------------------------------------------------- 6. progress lines, 12. GPU cache


def test_local_jobs_on_a_gpu_host_get_one_gpu_each(tmp_path, config_dir):
    """Three runs of one GPU each, four allowed at once, two GPUs visible: two waves, each job its own device."""
    import subprocess
    import sys

    import transformers as T

    from tests.helpers import COMMON

    model = tmp_path / "tiny"
    T.LlamaForCausalLM(T.LlamaConfig(**COMMON)).save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    path = study_yaml(tmp_path, [{"id": str(model), "name": n, "seed": i} for i, n in enumerate("abc")],
                  defaults={"corpus": "pydoc-topics", "short_docs": "concat", "docs": 2, "seq_len": 64,
                            "bucket_size": 16, "samples_per_bucket": 2, "heads": 4, "device": "cpu"},
                  resources={"gpus": 1, "array_parallelism": 4, "timeout_min": 10})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "0,1",
           "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", "study", str(path), "--executor", "local",
                        "--stage", "capture"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    attempts = {n: [json.loads(x) for x in (tmp_path / "out" / n / "study-attempts.jsonl").read_text().splitlines()]
                for n in "abc"}
    assert [attempts[n][0]["cuda_visible_devices"] for n in "abc"] == ["0", "1", "0"]
    # the third started only after the first wave ended: never three jobs on two GPUs
    finished = {n: json.loads((tmp_path / "out" / n / "study-done.json").read_text())["finished"] for n in "ab"}
    assert attempts["c"][0]["started"] >= max(finished.values())
    dry = subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", "study", str(path), "--executor", "local",
                          "--dry-run", "--stage", "analyze"], env=env, capture_output=True, text=True, timeout=600)
    assert "wave 1: a (CUDA_VISIBLE_DEVICES=0), b (CUDA_VISIBLE_DEVICES=1)" in dry.stdout, dry.stdout + dry.stderr


