"""Studies: validation of study files, the shipped studies against the thesis, status, and the cross-run tables
(real jobs: tests/acceptance/pipeline/test_study.py)."""

from __future__ import annotations


import pytest

from qkplast.results import reference
from qkplast.pipeline.study import status
from qkplast.rundir.study_file import StudyError, load_study, parse_study, slug
from tests.helpers import ROOT, cli, write_yaml

STUDIES = ROOT / "studies"


# --------------------------------------------------------------------------- validation


def test_entries_merge_defaults_and_split_revision(tmp_path):
    s = parse_study({"name": "s", "allow_floating": True, "out": str(tmp_path / "o"), "defaults": {"seq_len": 4096, "bucket_size": 256,
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
    path = write_yaml(tmp_path / "bad.yaml", {"allow_floating": True, "name": "bad", "out": str(tmp_path / "out"), "models": models})
    with pytest.raises(StudyError, match=message):
        load_study(path)
    code, out, err = cli(capsys, "study", str(path))
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
    path = write_yaml(tmp_path / "s.yaml", {"allow_floating": True, "name": "s", "out": str(tmp_path / "o"), "models": [{"id": "a/b"}, {"id": "c"}]})
    rows = status(load_study(path))
    assert [(r["run"], r["state"]) for r in rows] == [("a-b", "pending"), ("c", "pending")]
    code, out, _ = cli(capsys, "study", str(path), "--status")
    assert code == 0 and out.splitlines() == ["a-b: pending", "c: pending"]


# --------------------------------------------------------------------------- the shipped studies


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


# --------------------------------------------------------------------------- the cross-run tables


@pytest.fixture(scope="module")
def planted_study(tmp_path_factory):
    """A study of three runs (two of thesis models by name, one not) whose metrics come from planted captures."""
    import warnings

    import numpy as np

    import qkplast
    from qkplast.analysis.plasticity import PlasticityWarning
    from qkplast.theory.planted import planted_capture

    root = tmp_path_factory.mktemp("study")
    path = write_yaml(root / "s.yaml", {"allow_floating": True, "name": "planted", "out": str(root / "out"), "models": [
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


def test_injected_parameters_fold_into_the_parameters_cell(tmp_path):
    import nbformat

    from qkplast.pipeline.book import fold_injected_parameters

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


def test_a_folded_path_inside_the_checkout_is_shown_relative_to_the_notebooks(tmp_path):
    """``qkplast run`` passes the run directory absolute; the book's parameters cell shows it as the defaults are
    written (relative to ``notebooks/``), so no page names the folder this machine keeps the checkout in."""
    import nbformat

    from qkplast.pipeline.book import fold_injected_parameters
    from tests.helpers import ROOT

    run, full = ROOT / "runs" / "smollm2-135m", ROOT / "data" / "miniature-full"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('run_dir = "../runs/smollm2-135m"  # the run\nfull_run = ""  # shipped',
                                          metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(f'# Parameters\nrun_dir = "{run}"\nfull_run = "{full}"\nstudy = "/elsewhere/s"\n',
                                          metadata={"tags": ["injected-parameters"]})]
    nbformat.write(nb, tmp_path / "n.ipynb")
    assert fold_injected_parameters(tmp_path / "n.ipynb")
    assert nbformat.read(tmp_path / "n.ipynb", 4).cells[0].source.splitlines() == [
        'run_dir = "../runs/smollm2-135m"  # the run', 'full_run = "../data/miniature-full"  # shipped',
        'study = "/elsewhere/s"']


def test_compare_reads_every_analysed_run_of_a_study(planted_study, tmp_path, capsys):
    from qkplast.results import crossrun
    from qkplast.results.summary import compare

    table = compare([planted_study.source])
    assert list(table.index) == ["Qwen-3-4B", "meta-llama-llama-3.2-3b", "x-other"]  # study order, analysed runs
    code, out, _ = cli(capsys, "compare", str(planted_study.source), "--out", str(tmp_path / "t.csv"))
    assert code == 0 and (tmp_path / "t.csv").read_text().count("\n") == 4
    written = crossrun.write_compare(planted_study, tmp_path / "tables")
    assert sorted(p.stem for p in written) == ["benchmark", "geometry", "summary", "table_6_1"]


def test_a_checkpoint_series_gets_the_trajectory_in_study_order(planted_study, tmp_path):
    import shutil

    from qkplast.results import crossrun

    path = write_yaml(tmp_path / "c.yaml", {"allow_floating": True, "name": "series", "out": str(tmp_path / "out"), "models": [
        {"id": "org/ckpts@stage1-step-40000", "name": "stg1_40k"}, {"id": "org/ckpts@lc-x", "name": "late"}]})
    study = load_study(path)
    for r, src in zip(study.runs, planted_study.runs[:2]):
        r.run_dir.mkdir(parents=True)
        shutil.copy(src.run_dir / "metrics.nc", r.run_dir / "metrics.nc")
    assert crossrun.is_checkpoint_series(study)
    t = crossrun.trajectory(study)
    assert list(t.index) == ["stg1_40k", "late"] and list(t["thesis row"]) == ["stg1 40K", ""]
    assert "trajectory" in crossrun.compare_tables(study)
