"""Studies: validation of study files, the shipped studies against the thesis, submitit jobs that resume
after a forced timeout (local executor), and a real one-node SLURM cluster running a two-run study."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers as T
import yaml

from qkplast.results import reference
from qkplast.pipeline.cli import main
from qkplast.pipeline.study import (STAGES, StudyError, format_status, is_done, load_study, parse_study, slug, status)
from test_capture import COMMON, tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "studies"


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- validation (unit)


def test_entries_merge_defaults_and_split_revision(tmp_path):
    s = parse_study({"name": "s", "out": str(tmp_path / "o"), "defaults": {"seq_len": 4096, "bucket_size": 256,
                                                                          "analysis": {"n_pairs": 64}},
                     "resources": {"gpus": 1, "timeout_min": 30},
                     "models": [{"id": "Qwen/Qwen3-0.6B", "rope_scaling": "yarn:4:32768"},
                                {"id": "HuggingFaceTB/SmolLM3-3B-checkpoints@stage1-step-40000", "name": "s1",
                                 "seq_len": 8192, "analysis": {"covariance": "full"}, "resources": {"gpus": 2}}]},
                    tmp_path / "s.yaml")
    a, b = s.runs
    assert a.name == "qwen-qwen3-0.6b" == slug("Qwen/Qwen3-0.6B") and a.run_dir == tmp_path / "o" / a.name
    assert (a.capture.model, a.capture.revision, a.capture.seq_len, a.capture.rope_scaling) == (
        "Qwen/Qwen3-0.6B", None, 4096, "yarn:4:32768")
    assert (b.capture.model, b.capture.revision, b.capture.seq_len, b.capture.bucket_size) == (
        "HuggingFaceTB/SmolLM3-3B-checkpoints", "stage1-step-40000", 8192, 256)
    assert a.analysis == {"n_pairs": 64} and b.analysis == {"n_pairs": 64, "covariance": "full"}
    assert a.resources["gpus"] == 1 and b.resources["gpus"] == 2 and b.resources["timeout_min"] == 30


@pytest.mark.parametrize("models, message", [
    ([{"id": "a/b", "seq_lenx": 3}], r"models\[0\] \(a/b\): unknown key\(s\) \['seq_lenx'\]"),
    ([{"id": "a/b"}, {"id": "a/b"}], r"models\[1\] \(a/b\): duplicate name 'a-b' \(also models\[0\]\)"),
    ([{"id": "a/b"}, {"name": "x"}], r"models\[1\] \(x\): missing 'id'"),
    ([{"id": "a/b", "analysis": {"covariance": "nope"}}], r"models\[0\] \(a/b\): analysis: .*covariance"),
    ([{"id": "a/b@r1", "revision": "r2"}], r"models\[0\] \(a/b@r1\): id names revision 'r1'"),
    ([{"id": "a/b", "resources": {"gpu": 1}}], r"models\[0\] \(a/b\): resources: unknown key\(s\) \['gpu'\]"),
    ([{"id": "a/b", "name": "../x"}], r"models\[0\] \(\.\./x\): name '\.\./x'"),
])
def test_bad_entries_are_refused_naming_the_entry(tmp_path, capsys, models, message):
    path = _write(tmp_path / "bad.yaml", {"name": "bad", "out": str(tmp_path / "out"), "models": models})
    with pytest.raises(StudyError, match=message):
        load_study(path)
    code, out, err = _cli(capsys, "study", str(path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("qkplast study: error: ")
    assert not (tmp_path / "out").exists()  # nothing submitted, nothing written


def test_unknown_top_level_and_default_keys_are_refused(tmp_path):
    with pytest.raises(StudyError, match="unknown key"):
        parse_study({"name": "x", "model": [], "models": [{"id": "a"}]}, tmp_path / "x.yaml")
    with pytest.raises(StudyError, match="defaults: unknown key"):
        parse_study({"name": "x", "defaults": {"layers": 3}, "models": [{"id": "a"}]}, tmp_path / "x.yaml")
    (tmp_path / "y.yaml").write_text("a: [")
    with pytest.raises(StudyError, match="not valid YAML"):
        load_study(tmp_path / "y.yaml")


def test_status_of_a_fresh_study_is_pending(tmp_path, capsys):
    path = _write(tmp_path / "s.yaml", {"name": "s", "out": str(tmp_path / "o"), "models": [{"id": "a/b"}, {"id": "c"}]})
    rows = status(load_study(path))
    assert [(r["run"], r["state"]) for r in rows] == [("a-b", "pending"), ("c", "pending")]
    code, out, _ = _cli(capsys, "study", str(path), "--status")
    assert code == 0 and out.splitlines() == ["a-b: pending", "c: pending"]


# --------------------------------------------------------------------------- the shipped studies (unit)


def test_thesis_study_matches_table_5_1():
    study = load_study(STUDIES / "thesis.yaml")
    models = reference.load("models").set_index("model")
    assert [r.name for r in study.runs] == list(models.index)  # 13 runs, in Table 5.1's order
    for r in study.runs:
        row = models.loc[r.name]
        assert r.capture.seq_len == min(int(row.context_tokens), 131072), r.name
        assert r.capture.bucket_size == r.capture.seq_len // 16, r.name  # 16 buckets (5.4.1)
        assert (r.capture.rope_scaling == "yarn:4:32768") == ("YaRN" in row.pos_enc), r.name  # 5.4.2
        assert (r.capture.heads, r.capture.seed, r.capture.samples_per_bucket) == (300, 0, 1)
        assert r.capture.device == "cuda" and r.capture.dtype == "bfloat16"
    assert study.resources["gpus"] == 1 and study.resources["max_num_timeout"] >= 1


def test_checkpoint_study_matches_table_5_2():
    study = load_study(STUDIES / "smollm3-checkpoints.yaml")
    table = reference.load("smollm3_checkpoints")
    assert [r.name for r in study.runs] == table.checkpoint.tolist()  # training order
    for r, (_, row) in zip(study.runs, table.iterrows()):
        assert r.capture.model == "HuggingFaceTB/SmolLM3-3B-checkpoints" and r.capture.revision
        assert r.capture.seq_len == row.context_tokens and r.capture.bucket_size == row.bucket_size_tokens
        stage = r.capture.revision.split("-step-")[0]
        assert stage == {"stage1": "stage1", "stage2": "stage2", "stage3": "stage3",
                         "lc_4k_32k": "lc-4k-to-32k", "lc_32k_64k": "lc-32k-to-64k"}[row.stage]
        assert r.capture.revision.endswith(f"-step-{row.steps}")
    from qkplast.results.crossrun import is_checkpoint_series

    assert is_checkpoint_series(study)


def test_local_study_is_the_embedded_model_on_this_machine():
    study = load_study(STUDIES / "local.yaml")
    assert len(study.runs) >= 3 and {r.capture.model for r in study.runs} == {"smollm2-135m"}
    assert {r.capture.device for r in study.runs} == {"cpu"}
    assert all(r.capture.seq_len <= 8192 for r in study.runs)  # SmolLM2-135M's context
    from qkplast.results.crossrun import is_checkpoint_series

    assert not is_checkpoint_series(study)


# --------------------------------------------------------------------------- real jobs (acceptance)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama checkpoint with its tokenizer, saved like a downloaded model."""
    path = tmp_path_factory.mktemp("tiny-llama")
    T.LlamaForCausalLM(T.LlamaConfig(**COMMON)).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    """A random Llama of 4 layers, width 512 (38 MB): a 1024-token window costs a measurable forward."""
    path = tmp_path_factory.mktemp("wide-llama")
    config = {**COMMON, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 64, "num_hidden_layers": 4, "max_position_embeddings": 1024}
    T.LlamaForCausalLM(T.LlamaConfig(**config)).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def _qkplast(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout)


@pytest.mark.acceptance
def test_local_jobs_requeued_after_a_timeout_resume_from_their_parts(tmp_path, wide_dir):
    # Run "a" gets the timeout signal 15 s into each attempt (30 s limit, 15 s signal delay) and has more
    # windows than one attempt captures (40 windows of 1024 tokens, about 0.5 s each on an idle core, after a few
    # seconds of start-up; a 30 s signal let an idle machine finish 60 in the first attempt, leaving nothing
    # to resume), so
    # it spans several attempts, each resuming from the parts on disk. Run "b" is small and has its own
    # resources (a second job group); it finishes at once.
    docs = 40
    study = _write(tmp_path / "s.yaml", {
        "name": "requeue", "out": str(tmp_path / "out"),
        "defaults": {"corpus": "stdlib-code", "seq_len": 1024, "bucket_size": 64, "samples_per_bucket": 2,
                     "heads": 5, "docs": docs},
        "resources": {"timeout_min": 0.5, "signal_delay_s": 15, "max_num_timeout": 15},
        "models": [{"id": str(wide_dir), "name": "a"},
                   {"id": str(wide_dir), "name": "b", "seed": 1, "docs": 2, "resources": {"timeout_min": 10}}]})
    r = _qkplast("study", str(study), "--executor", "local", "--stage", "capture")
    jobs = json.loads((tmp_path / "out" / "study.json").read_text())["runs"]
    first_job = jobs["a"]["job_id"]
    # On a busy machine the local executor's retries (6 at most) may end before the capture does; running
    # the study again resumes it (the other way a run resumes), and submits only the unfinished run.
    for _ in range(3):
        if r.returncode == 0:
            break
        assert "a: failed" in r.stdout and "run the study again to resume it" in r.stdout, r.stdout + r.stderr
        r = _qkplast("study", str(study), "--executor", "local", "--stage", "capture")
        assert "b: done (capture), not submitted" in r.stdout
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = json.loads((tmp_path / "out" / "study.json").read_text())["runs"]
    assert r.stdout.strip().splitlines()[-2:] == [f"{n}: done (job {jobs[n]['job_id']})" for n in ("a", "b")]
    from qkplast.io import open_capture

    attempts = {n: [json.loads(line) for line in (tmp_path / "out" / n / "study-attempts.jsonl").read_text().splitlines()]
                for n in ("a", "b")}
    a = attempts["a"]
    first = [x for x in a if x["job_id"] == first_job]
    assert len(first) >= 2, f"the job was never requeued ({a})"  # requeued as the same job
    # an attempt that starts after the prose capture is complete (the batch then captures the code corpus)
    # finds its parts merged into capture.nc: it counts as all documents done
    resumed = [docs if x.get("capture_done") else x["parts_at_start"] for x in a[1:]]
    assert max(x["parts_at_start"] for x in first[1:]) > 0, f"no requeued attempt found parts to resume from ({a})"
    assert resumed == sorted(resumed) and resumed[-1] <= docs  # parts only added; the last attempt finished the rest
    assert len(attempts["b"]) == 1
    assert "timed-out" in (tmp_path / "out" / "logs" / first_job / f"{first_job}_0_log.err").read_text()
    for name, docs in (("a", docs), ("b", 2)):
        run = tmp_path / "out" / name
        cap = open_capture(run / "capture.nc")
        assert cap.attrs["docs"] == docs and len(set(cap.doc.values)) == docs
        assert is_done(run, "capture") and not is_done(run, "analyze")
        assert not (run / "capture.nc.parts").exists()
    assert all(Path(v["stdout"]).exists() for v in jobs.values())
    # a second invocation submits nothing: both runs are done to this stage
    again = _qkplast("study", str(study), "--executor", "local", "--stage", "capture")
    assert again.returncode == 0 and "submitted job" not in again.stdout and again.stdout.count("not submitted") == 2


@pytest.fixture
def slurm(tmp_path_factory):
    """A one-node SLURM cluster (munged, slurmctld, slurmd) for the test; stopped afterwards."""
    from slurm_cluster import Cluster, ClusterError, missing_binaries

    if os.geteuid() != 0:
        pytest.skip("the SLURM daemons need root to start (slurmd runs jobs as their user)")
    missing = missing_binaries()
    if missing:
        pytest.fail(f"SLURM test cluster: {missing} not installed (apt-get install slurm-wlm munge; .ci/run does)")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except ClusterError as exc:
        cluster.stop()
        pytest.fail(f"SLURM test cluster did not start: {exc}")
    yield cluster
    cluster.stop()


@pytest.mark.acceptance
def test_a_two_run_study_runs_on_a_one_node_slurm_cluster(tmp_path, tiny_dir, slurm):
    study = _write(tmp_path / "s.yaml", {
        "name": "slurm", "out": str(tmp_path / "out"),
        "defaults": {"corpus": "pydoc-topics", "seq_len": 64, "bucket_size": 16, "samples_per_bucket": 2,
                     "heads": 5, "docs": 4},
        "resources": {"timeout_min": 10, "mem_gb": 1, "cpus": 1, "array_parallelism": 2, "partition": "debug"},
        "models": [{"id": str(tiny_dir), "name": "a"}, {"id": str(tiny_dir), "name": "b", "seed": 1}]})
    env = {**_env(), **{"SLURM_CONF": str(slurm.conf)}}
    r = _qkplast("study", str(study), "--executor", "slurm", "--stage", "analyze", env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "submitted 2 job(s)" in r.stdout
    jobs = json.loads((tmp_path / "out" / "study.json").read_text())["runs"]
    array = {v["job_id"].split("_")[0] for v in jobs.values()}
    assert len(array) == 1 and sorted(v["job_id"].split("_")[1] for v in jobs.values()) == ["0", "1"]  # one array
    deadline, lines = time.monotonic() + 240, ""
    while time.monotonic() < deadline:
        s = _qkplast("study", str(study), "--status", env=env, timeout=60)
        lines = s.stdout
        if all(": done" in line or ": failed" in line for line in lines.splitlines()):
            break
        time.sleep(3)
    assert lines.splitlines() == [f"{n}: done (job {jobs[n]['job_id']})" for n in ("a", "b")], (
        lines + "\n" + "\n".join(Path(v["stderr"]).read_text()[-2000:] for v in jobs.values() if Path(v["stderr"]).exists()))
    for name in ("a", "b"):
        assert (tmp_path / "out" / name / "metrics.nc").exists() and is_done(tmp_path / "out" / name, "analyze")
    assert STAGES == ("capture", "analyze", "notebooks") and "done" in format_status(status(load_study(study)))


# --------------------------------------------------------------------------- the cross-run tables (unit)


@pytest.fixture(scope="module")
def planted_study(tmp_path_factory):
    """A study of three runs (two of thesis models by name, one not) whose metrics come from planted captures."""
    import warnings

    import numpy as np

    import qkplast
    from qkplast.analysis.plasticity import PlasticityWarning
    from qkplast.theory.planted import planted_capture

    root = tmp_path_factory.mktemp("study")
    path = _write(root / "s.yaml", {"name": "planted", "out": str(root / "out"), "models": [
        {"id": "Qwen/Qwen3-4B", "name": "Qwen-3-4B"}, {"id": "meta-llama/Llama-3.2-3B"}, {"id": "x/other"},
        {"id": "x/never-ran"}]})
    study = load_study(path)
    for i, r in enumerate(study.runs[:3]):
        cap, _ = planted_capture(n_heads=6, dim=8, seq_len=2048, bucket_size=128, n_docs=4, samples_per_bucket=2,
                                 seed=i)
        cap = cap.assign_coords(layer=("head", np.arange(6) // 2), q_head=("head", np.arange(6) % 2),
                                kv_head=("head", np.arange(6) % 2 // 3))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlasticityWarning)
            m = qkplast.analyze(cap, n_pairs=16)
        r.run_dir.mkdir(parents=True)
        qkplast.save_dataset(m, r.run_dir / "metrics.nc")
    return study


def test_cross_run_tables_have_a_row_per_run_in_study_order(planted_study):
    from qkplast.results import crossrun

    assert list(crossrun.study_metrics(planted_study)) == ["Qwen-3-4B", "meta-llama-llama-3.2-3b", "x-other"]
    assert crossrun.missing_runs(planted_study) == ["x-never-ran"]
    t = crossrun.table_6_1(planted_study)
    ours = [m for g, m in t.index if not g.startswith("thesis")]
    assert ours == ["Qwen-3-4B", "meta-llama-llama-3.2-3b", "x-other"] and len(t) == 3 + 11
    m = crossrun.study_metrics(planted_study)["x-other"]
    row = t.xs("x-other", level="model").iloc[0]
    assert row["AP_drop"] == pytest.approx(float(m.ap_drop.mean()), abs=1e-3)
    lo, hi = map(float, row["AP_drop 95% interval (heads)"].strip("[]").split(","))
    assert lo <= row["AP_drop"] + 1e-3 and row["AP_drop"] - 1e-3 <= hi and lo < hi
    g = crossrun.geometry_across(planted_study)
    assert list(g.columns) == ["thesis", "Qwen-3-4B", "meta-llama-llama-3.2-3b", "x-other"]
    assert crossrun.profiles(planted_study).sizes == {"run": 3, "context_bin": 5}
    fig = crossrun.profiles_figure(planted_study)
    assert len(fig.axes[0].lines) == 3 + 11 and fig.axes[0].get_legend() is not None


def test_benchmark_matches_pair_runs_with_their_thesis_model(planted_study):
    from qkplast.results import crossrun

    assert crossrun.thesis_model("Qwen-3-4B", "whatever") == "Qwen-3-4B"
    assert crossrun.thesis_model("r", "mistralai/Ministral-3-14B-Base-2512") == "Ministral-3-14B"
    assert crossrun.thesis_model("r", "Qwen/Qwen3-14B") == "Qwen-3-14B"  # not Qwen-3-1.7B or -1
    assert crossrun.thesis_model("r", "HuggingFaceTB/SmolLM2-135M") is None
    b = crossrun.benchmark_matches(planted_study)
    assert list(b.index) == ["Qwen-3-4B", "meta-llama-llama-3.2-3b"]
    assert b.loc["Qwen-3-4B", "LongBench-Pro"] == reference.load("longbench_matched").set_index("model").loc[
        "Qwen-3-4B", "lbp_score"]
    assert not crossrun.is_checkpoint_series(planted_study)
    fig = crossrun.benchmark_figure(planted_study)
    assert len(fig.axes[0].collections) >= 4  # three thesis families and this study's runs


def test_head_bootstrap_interval_covers_the_mean_and_shrinks_with_more_heads():
    import numpy as np

    from qkplast.results.crossrun import head_bootstrap

    rng = np.random.default_rng(0)
    small, large = rng.normal(0.1, 0.05, 20), rng.normal(0.1, 0.05, 2000)
    (a, b), (c, d) = head_bootstrap(small), head_bootstrap(large)
    assert a < small.mean() < b and c < large.mean() < d and (d - c) < (b - a) / 5


def test_injected_parameters_fold_into_the_parameters_cell(tmp_path):
    import nbformat

    from qkplast.results.crossrun import fold_injected_parameters

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t"),
                nbformat.v4.new_code_cell('seq_len = 2048  # tokens per window\nstudy = ""  # a study',
                                          metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell('# Parameters\nseq_len = 256\nstudy = "/r/local"\nrun_dir = "/r/a"\n',
                                          metadata={"tags": ["injected-parameters"]}),
                nbformat.v4.new_code_cell("print(seq_len)")]
    nbformat.write(nb, tmp_path / "n.ipynb")
    assert fold_injected_parameters(tmp_path / "n.ipynb")
    out = nbformat.read(tmp_path / "n.ipynb", 4)
    assert len(out.cells) == 3 and not any("injected-parameters" in c.metadata.get("tags", []) for c in out.cells)
    assert out.cells[1].source.splitlines() == ['seq_len = 256  # tokens per window', 'study = "/r/local"  # a study',
                                                'run_dir = "/r/a"']
    assert not fold_injected_parameters(tmp_path / "n.ipynb")  # nothing left to fold


def test_compare_reads_every_analysed_run_of_a_study(planted_study, tmp_path, capsys):
    from qkplast.pipeline import batch
    from qkplast.results import crossrun

    table = batch.compare([planted_study.source])
    assert list(table.index) == ["Qwen-3-4B", "meta-llama-llama-3.2-3b", "x-other"]  # study order, analysed runs
    code, out, _ = _cli(capsys, "compare", str(planted_study.source), "--out", str(tmp_path / "t.csv"))
    assert code == 0 and (tmp_path / "t.csv").read_text().count("\n") == 4
    written = crossrun.write_compare(planted_study, tmp_path / "tables")
    assert sorted(p.stem for p in written) == ["benchmark", "geometry", "summary", "table_6_1"]


def test_a_checkpoint_series_gets_the_trajectory_in_study_order(planted_study, tmp_path):
    import shutil

    from qkplast.results import crossrun

    path = _write(tmp_path / "c.yaml", {"name": "series", "out": str(tmp_path / "out"), "models": [
        {"id": "org/ckpts@stage1-step-40000", "name": "stg1_40k"}, {"id": "org/ckpts@lc-x", "name": "late"}]})
    study = load_study(path)
    for r, src in zip(study.runs, planted_study.runs[:2]):
        r.run_dir.mkdir(parents=True)
        shutil.copy(src.run_dir / "metrics.nc", r.run_dir / "metrics.nc")
    assert crossrun.is_checkpoint_series(study)
    t = crossrun.trajectory(study)
    assert list(t.index) == ["stg1_40k", "late"] and list(t["thesis row"]) == ["stg1 40K", ""]
    assert "trajectory" in crossrun.compare_tables(study)


def test_a_live_run_is_not_submitted_twice_and_a_dead_one_is_failed(tmp_path, capsys):
    from qkplast.pipeline.study import STATE, submit

    path = _write(tmp_path / "s.yaml", {"name": "s", "out": str(tmp_path / "o"), "models": [{"id": "a/b"}]})
    study = load_study(path)
    run = study.runs[0].run_dir
    run.mkdir(parents=True)
    (run / STATE).write_text(json.dumps({"state": "running", "pid": os.getpid(), "host": os.uname().nodename}))
    lines = []
    assert submit(study, "local", "capture", echo=lines.append) == {}
    assert lines == ["a-b: running (job None), not submitted"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run / STATE).write_text(json.dumps({"state": "running", "pid": int(dead.stdout), "host": os.uname().nodename}))
    row = status(study)[0]
    assert row["state"] == "failed" and "run the study again to resume it" in row["reason"]
    code, out, _ = _cli(capsys, "study", str(path), "--status")
    assert code == 0 and out.startswith("a-b: failed: the job ended without finishing")
