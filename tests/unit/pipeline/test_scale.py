"""Issue 23, the thesis-scale path without a GPU: the code capture sized to its corpus, the memory plan
(refusal, float32 upcasts, LM-head chunks, several GPUs), studies validated before submission (SLURM keys and
dry run, pinned and floating revisions, the commit a requeued job checks), local jobs one GPU each, progress
lines, and the GPU cache emptied before the notebooks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import transformers as T

from qkplast.capture.plan import (KAPPA, activation_bytes_per_token, live_elements_per_token,
                                  logits_chunk_rows, logits_pass_gb, plan_capture, size_code_capture,
                                  upcast_bytes_per_token)
from qkplast.options import CaptureOptions
from qkplast.pipeline.cli import main
from qkplast.rundir.study_file import StudyError, load_study, parse_study
from tests.helpers import QWEN3_8B, jsonl_corpus, study_yaml, tiny_tokenizer



# --------------------------------------------------------------------------- 1. the code capture


def test_code_capture_sized_to_what_its_corpus_yields(config_dir, tmp_path):
    from qkplast.capture.corpus import count_windows, open_corpus
    from qkplast.capture.models import load_tokenizer

    main_run = CaptureOptions(model=str(config_dir), corpus="pydoc-topics", short_docs="concat", docs=4, seq_len=1024,
                              bucket_size=64, samples_per_bucket=4, device="cpu")
    tok = load_tokenizer(str(config_dir))
    many = jsonl_corpus(tmp_path / "many.jsonl", [9000] * 5)
    few = jsonl_corpus(tmp_path / "few.jsonl", [9000] * 3 + [300] * 4)
    short = jsonl_corpus(tmp_path / "short.jsonl", [9000] + [1100] * 6)
    tiny = jsonl_corpus(tmp_path / "tiny.jsonl", [150] * 20)
    skip = replace(main_run, short_docs="skip")
    # what the corpora hold, counted as the capture counts (the premises of the cases below)
    assert count_windows(open_corpus(str(many)), tok, skip, strict=False) == 4
    assert count_windows(open_corpus(str(few)), tok, skip, strict=False) == 3
    assert count_windows(open_corpus(str(short)), tok, skip, strict=False) == 1
    assert count_windows(open_corpus(str(short)), tok, replace(skip, seq_len=512, bucket_size=32), strict=False) == 4

    as_run = size_code_capture(skip, str(many), tok)
    assert as_run.status == "as-run" and as_run.options == replace(skip, corpus=str(many))
    fewer = size_code_capture(skip, str(few), tok)
    assert fewer.status == "fewer" and (fewer.options.docs, fewer.options.seq_len) == (3, 1024)
    assert "3 windows of 1024 tokens" in fewer.note and "the run has 4" in fewer.note
    shorter = size_code_capture(skip, str(short), tok)
    assert shorter.status == "shorter"
    assert (shorter.options.docs, shorter.options.seq_len, shorter.options.bucket_size) == (4, 512, 32)  # 16 buckets kept
    skipped = size_code_capture(skip, str(tiny), tok)
    assert skipped.options is None and skipped.status == "skipped" and "no prose/code comparison" in skipped.note
    # every halving is counted from one encoding of the corpus: each document's text is tokenized once
    encoded = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tok, name)

        def __call__(self, texts, **kwargs):
            encoded.extend([texts] if isinstance(texts, str) else texts)
            return tok(texts, **kwargs)

    corpus_chars = sum(len(doc.text) for doc in open_corpus(str(tiny)))
    assert size_code_capture(skip, str(tiny), Counting()).status == "skipped"
    assert corpus_chars <= sum(map(len, encoded)) < corpus_chars + 100  # once, not once per length tried (four)
    same = size_code_capture(main_run, "pydoc-topics", tok)
    assert same.options is None and same.status == "same-corpus"  # never a duplicate of the run's capture
    missing = size_code_capture(skip, str(tmp_path / "nowhere.jsonl"), tok)
    assert missing.options is None and "no such file" in missing.note  # a bad code corpus never stops the run


def test_a_code_capture_that_fails_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    """The code capture is optional: its failure (here a corpus made unreadable after sizing) leaves it out."""
    from qkplast.capture.corpus import open_corpus_for
    from qkplast.capture.plan import CodeCapture
    from qkplast.pipeline import stages
    from qkplast.theory.planted import planted_capture

    import qkplast.capture.driver as driver
    import qkplast.capture.models as models

    def fake_capture(options, out, *, overwrite=False, progress=True, loaded=None):
        cap, _ = planted_capture(n_heads=2, dim=8, seq_len=options.seq_len, bucket_size=options.bucket_size,
                                 n_docs=options.docs, samples_per_bucket=2)
        cap.attrs.update(corpus=options.corpus, commit="0123abc")
        from qkplast.capture_format import save_capture

        save_capture(cap, out)
        return cap

    capture = CaptureOptions(seq_len=1024, bucket_size=128, docs=3, corpus="pydoc-topics")
    code = replace(capture, corpus=str(tmp_path / "gone.jsonl"))
    monkeypatch.setattr(stages, "code_capture", lambda *a: CodeCapture(code, "as-run", "sized"))
    monkeypatch.setattr(stages, "check_memory", lambda *a, **k: None)
    # the run's own preflight reads the model's config (not this test's subject); the code corpus's is checked
    monkeypatch.setattr(stages, "check_windows", lambda options: None if options.corpus == capture.corpus
                        else open_corpus_for(options))
    monkeypatch.setattr(models, "load_for", lambda options, plan=None: "model")
    monkeypatch.setattr(models, "release_model", lambda loaded: None)
    monkeypatch.setattr(driver, "run_capture", fake_capture)
    result = stages.run(capture, tmp_path / "run", stage="analyze", progress=False)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert result.manifest["status"] == "ok" and (tmp_path / "run" / "metrics.nc").exists()
    assert manifest["code"]["status"] == "failed" and "gone.jsonl" in manifest["code"]["note"]
    assert not (tmp_path / "run" / "code" / "capture.nc").exists()
    from qkplast.rundir import load_run

    assert load_run(tmp_path / "run").code("stdlib-code") == (None, manifest["code"]["note"])  # chapter 09's note


# --------------------------------------------------------------------------- 7. memory


def test_run_refuses_a_capture_the_plan_says_does_not_fit_before_any_weights(config_dir, tmp_path, monkeypatch,
                                                                            capsys):
    import qkplast.capture.models as models

    monkeypatch.setattr(models, "load_for", lambda options, plan=None: pytest.fail("weights loaded"))
    argv = ["run", "--model", str(config_dir), "--corpus", "pydoc-topics", "--short-docs", "concat", "--docs", "2",
            "--seq-len", "256", "--bucket-size", "16", "--samples-per-bucket", "2", "--device-memory-gb", "0.00001",
            "--out", str(tmp_path / "run"), "--no-progress", "--stage", "capture"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exceeds the 0.0 GiB of cpu" in err[0] and "--no-memory-check" in err[0]
    with pytest.raises(pytest.fail.Exception, match="weights loaded"):  # with the override the capture starts
        main(argv + ["--no-memory-check"])


def test_the_plan_counts_float32_upcasts_of_a_16_bit_model():
    wide_heads = T.Qwen3Config(hidden_size=64, intermediate_size=16, num_attention_heads=16, num_key_value_heads=2,
                               head_dim=32, num_hidden_layers=1, vocab_size=300)
    e = live_elements_per_token(wide_heads)
    assert upcast_bytes_per_token(wide_heads, 4) == 0  # a float32 model converts nothing
    # q-norm on 16 heads of 32: the normed input, q, and two float32 copies of q
    assert upcast_bytes_per_token(wide_heads, 2) == (64 + 512) * 2 + 2 * 4 * 512
    assert activation_bytes_per_token(wide_heads, "float32", "cpu") == pytest.approx(KAPPA * e * 4)
    bf16 = activation_bytes_per_token(wide_heads, "bfloat16", "cpu")
    assert bf16 == pytest.approx(KAPPA * ((2 * 64 + 2 * 32) * 2 + (64 + 512) * 2 + 8 * 512))
    assert bf16 > KAPPA * e * 2  # without the upcasts the plan would undercount this model
    qwen3 = T.Qwen3Config(**QWEN3_8B)  # the MLP phase stays the peak of a thesis model: upcasts change nothing
    assert activation_bytes_per_token(qwen3, "bfloat16", "cuda") == pytest.approx(KAPPA * live_elements_per_token(qwen3) * 2 + 4 * 32)


def test_the_plan_counts_the_lm_head_chunk_in_bytes():
    qwen3 = T.Qwen3Config(**QWEN3_8B)
    rows = logits_chunk_rows(151936, 2)
    assert rows == (1 << 30) // (151936 * 18) == 392  # not 4096 positions: 5 GB of float64 alone
    assert logits_pass_gb(qwen3, 131072, "bfloat16") == pytest.approx((2 * 131072 * 4096 * 2 + 392 * 151936 * 18) / 2**30)


def test_plan_spreads_weights_over_gpus_and_offers_it(tmp_path):
    path = tmp_path / "qwen3-8b"
    T.Qwen3Config(**{**QWEN3_8B, "vocab_size": 300}).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    options = CaptureOptions(model=str(path), seq_len=131072, bucket_size=8192, rope_scaling="yarn:4:32768",
                             device="cuda", dtype="bfloat16", docs=1)
    one = plan_capture(options, device_memory_gb=24, count=False)
    assert one.memory_problem() and "--device cuda:all" in one.memory_problem()
    two = plan_capture(replace(options, device="cuda:all"), device_memory_gb=24, count=False, gpus=2)
    assert two.gpus == 2 and two.weights_gb == pytest.approx(one.weights_gb / 2)
    assert two.peak_gb == pytest.approx(one.peak_gb - one.weights_gb / 2) and two.memory_problem() is None
    assert "per GPU (over 2)" in str(two)


# --------------------------------------------------------------------------- 5, 6, 9. studies


def test_floating_revisions_are_refused_unless_allowed(tmp_path, config_dir):
    commit = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(StudyError, match=r"models\[0\] \(o/m@main\): revision 'main' of o/m is a branch or tag"):
        load_study(study_yaml(tmp_path, [{"id": "o/m@main"}]))
    with pytest.raises(StudyError, match=r"models\[1\] \(o/m\): revision 'main'"):  # no revision floats on main
        load_study(study_yaml(tmp_path, [{"id": f"o/m@{commit}"}, {"id": "o/m"}]))
    pinned = load_study(study_yaml(tmp_path, [{"id": f"o/m@{commit}"}, {"id": str(config_dir)}, {"id": "smollm2-135m"}]))
    assert [r.capture.revision for r in pinned.runs] == [commit, None, None]
    assert load_study(study_yaml(tmp_path, [{"id": "o/m@lc-4k-to-32k-step-4000"}], allow_floating=True)).allow_floating
    with pytest.raises(StudyError, match="allow_floating must be true or false"):
        load_study(study_yaml(tmp_path, [{"id": "o/m"}], allow_floating="yes"))


def test_slurm_resource_keys_reach_the_batch_script(tmp_path, config_dir):
    from qkplast.pipeline.study import slurm_script

    res = {"gpus": 2, "gpu_type": "h100", "account": "proj42", "qos": "high", "constraint": "hopper",
           "partition": "gpu", "timeout_min": 90, "mem_gb": 32, "cpus": 8, "array_parallelism": 3,  # capped at 2 runs
           "setup": ["module load cuda/12.4", "source ~/venv/bin/activate"],
           "sbatch": {"exclusive": True, "mail-type": "END"}}
    study = load_study(study_yaml(tmp_path, [{"id": str(config_dir), "name": "a"}, {"id": str(config_dir), "name": "b",
                                                                                "seed": 1}], resources=res))
    script = slurm_script(study, list(study.runs))
    for line in ("#SBATCH --account=proj42", "#SBATCH --qos=high", "#SBATCH --constraint=hopper",
                 "#SBATCH --gres=gpu:h100:2", "#SBATCH --partition=gpu", "#SBATCH --time=90", "#SBATCH --mem=32GB",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --array=0-1%2", "#SBATCH --exclusive", "#SBATCH --mail-type=END",
                 "module load cuda/12.4", "source ~/venv/bin/activate"):
        assert line in script, (line, script)
    assert "--gpus-per-node" not in script  # the typed request replaces the untyped one
    assert script.index("module load cuda/12.4") < script.index("submitit.core._submit")  # setup runs first


@pytest.mark.parametrize("resources, message", [
    ({"acount": "x"}, r"unknown key\(s\) \['acount'\]"),
    ({"account": 3}, "account must be a non-empty string"),
    ({"setup": [1]}, "setup must be a shell line"),
    ({"sbatch": ["--exclusive"]}, "sbatch must map sbatch option names"),
    ({"gpu_memory_gb": "80"}, "gpu_memory_gb must be a non-negative number"),
])
def test_bad_resources_are_one_line_errors(tmp_path, capsys, resources, message):
    path = study_yaml(tmp_path, [{"id": "smollm2-135m"}], resources=resources)
    with pytest.raises(StudyError, match=message):
        load_study(path)
    assert main(["study", str(path), "--executor", "slurm", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("qkplast study: error: ")


def test_slurm_dry_run_validates_prints_the_script_and_submits_nothing(tmp_path, config_dir, capsys):
    path = study_yaml(tmp_path, [{"id": str(config_dir), "name": "a"}],
                  defaults={"corpus": "pydoc-topics", "short_docs": "concat", "docs": 2, "seq_len": 256,
                            "bucket_size": 16, "samples_per_bucket": 2, "device": "cpu"},
                  resources={"account": "proj42", "setup": "module load cuda"})
    assert main(["study", str(path), "--executor", "slurm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "a: ok (" in out and "#SBATCH --account=proj42" in out and "module load cuda" in out
    assert "dry run: 1 run(s) validated, nothing submitted" in out
    assert not (tmp_path / "out" / "study.json").exists() and not (tmp_path / "out" / "logs").exists()


def test_validation_names_every_failing_run_before_anything_is_submitted(tmp_path, config_dir, capsys):
    defaults = {"corpus": "pydoc-topics", "short_docs": "concat", "docs": 2, "seq_len": 256, "bucket_size": 16,
                "samples_per_bucket": 2, "device": "cpu"}
    path = study_yaml(tmp_path, [
        {"id": str(config_dir), "name": "good"},
        {"id": str(config_dir), "name": "too-many-windows", "docs": 100000},
        {"id": str(tmp_path / "no-such-model"), "name": "missing"},
        {"id": str(config_dir), "name": "too-long", "seq_len": 1 << 20, "bucket_size": 1 << 16},
        {"id": str(config_dir), "name": "too-big", "device": "cuda", "resources": {"gpu_memory_gb": 0.0001}},
    ], defaults=defaults, allow_floating=True)
    assert main(["study", str(path), "--executor", "slurm"]) == 2  # validated on the submitting host, no GPU here
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert lines[-5].startswith("good: ok (") and "2 windows of 256 tokens" in lines[-5]
    bad = [line for line in lines if ": INVALID: " in line]
    assert [line.split(":")[0] for line in bad] == ["too-many-windows", "missing", "too-long", "too-big"]
    assert "yields" in bad[0] and "unknown model" in bad[1] and "exceeds the model's maximum" in bad[2]
    assert "expected peak memory" in bad[3]
    assert err.strip() == ("qkplast study: error: 4 of 5 run(s) failed validation (too-many-windows, missing, too-long, "
                           "too-big; one line each above); nothing submitted")
    assert not (tmp_path / "out" / "study.json").exists() and not (tmp_path / "out" / "good").exists()


def test_a_requeued_job_refuses_a_branch_that_moved(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from tests.hub_fixtures import save_to_hub_cache, tiny_model
    from qkplast.pipeline.study import RunJob, resolved_commit, validate

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    first = save_to_hub_cache(tiny_model("llama3"), tiny_tokenizer(), "o/moving", tmp_path / "hub", branch="dev")
    study = load_study(study_yaml(tmp_path, [{"id": "o/moving@dev", "name": "r"}], allow_floating=True,
                              defaults={"corpus": "pydoc-topics", "short_docs": "concat", "docs": 1, "seq_len": 128,
                                        "bucket_size": 16, "samples_per_bucket": 2, "device": "cpu"}))
    resolved = validate(study, echo=lambda line: None, executor="local")
    assert resolved["r"]["commit"] == first == resolved_commit(study.runs[0])
    second = save_to_hub_cache(tiny_model("llama3", seed=1), tiny_tokenizer(), "o/moving", tmp_path / "hub",
                               branch="dev")
    assert second != first
    job = RunJob(study.runs[0], "capture", first)
    with pytest.raises(StudyError, match=f"resolved to commit {first} when the study was validated but to {second} now"):
        job()
    state = json.loads((study.runs[0].run_dir / "study-state.json").read_text())
    assert state["state"] == "failed" and "branch moved" in state["reason"]
    assert not (study.runs[0].run_dir / "capture.nc").exists()


# --------------------------------------------------------------------------- 4. local jobs on a GPU host


def test_local_jobs_are_capped_at_the_visible_gpus_each_on_its_own():
    from qkplast.pipeline.study import local_waves

    study = parse_study({"name": "g", "allow_floating": True, "resources": {"array_parallelism": 8},
                         "models": [{"id": "o/m", "name": f"r{i}", "device": "cuda"} for i in range(5)]},
                        Path("g.yaml"))
    waves = local_waves(list(study.runs), 8, [0, 1])
    assert [[(r.name, d) for r, d in w] for w in waves] == [
        [("r0", (0,)), ("r1", (1,))], [("r2", (0,)), ("r3", (1,))], [("r4", (0,))]]
    cpu = [replace(r, capture=replace(r.capture, device="cpu")) for r in study.runs]
    assert [len(w) for w in local_waves(cpu, 8, [0, 1])] == [5] and local_waves(cpu, 8, [])[0][0][1] == ()
    two = [replace(r, resources={**r.resources, "gpus": 2}) for r in study.runs[:3]]
    assert [[d for _, d in w] for w in local_waves(two, 8, [4, 5, 6, 7])] == [[(4, 5), (6, 7)], [(4, 5)]]
    with pytest.raises(StudyError, match="needs 1 GPU"):
        local_waves(list(study.runs), 8, [])


# --------------------------------------------------------------------------- 6. progress lines, 12. GPU cache


def test_progress_lines_say_window_rate_and_eta(capsys):
    from qkplast.capture.driver import ProgressLines

    clock = iter([0.0, 12.0, 26.0])
    lines = ProgressLines(500, 131072)
    lines.clock = lambda: next(clock)
    lines.start = lines.clock()
    lines.reused(0)
    lines.done(1, "doc-a")
    lines.done(2, "doc-b")
    err = capsys.readouterr().err.splitlines()
    assert err == ["[capture] window 1 of 500: reused from its part",
                   "[capture] window 2 of 500 (doc-a, 131072 tokens): 12.0 s/window, ETA 1h39m",
                   "[capture] window 3 of 500 (doc-b, 131072 tokens): 13.0 s/window, ETA 1h47m"]


def test_the_gpu_cache_is_emptied_after_the_analyses_before_the_notebooks(tmp_path, monkeypatch):
    import torch

    from qkplast.pipeline import stages

    order = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("empty_cache"))
    monkeypatch.setattr(stages, "code_capture", lambda *a: __import__("qkplast.capture.plan", fromlist=["x"]).CodeCapture(
        None, "skipped", "none"))
    monkeypatch.setattr(stages, "check_before_weights", lambda *a, **k: None)  # reads the model's config
    monkeypatch.setattr(stages, "capture_stage", lambda *a, **k: order.append("capture"))
    monkeypatch.setattr(stages, "open_dataset", lambda path: type("D", (), {"attrs": {}})())
    monkeypatch.setattr(stages, "analyze_stage", lambda *a, **k: order.append("analyze"))
    monkeypatch.setattr(stages, "notebook_stage", lambda *a, **k: order.append("notebooks"))
    stages.run(CaptureOptions(), tmp_path / "run", progress=False, notebooks=[])
    assert order == ["capture", "analyze", "empty_cache", "notebooks"]


