"""Bad input on the thesis-scale path (issue 23, item 13): every bad flag value, corpus file or study file is one
line on stderr and exit status 2, before any weights load, for each command that takes it (capture, plan, run,
study, analyze, compare). The faults with a real capture (two writers, kills) are in
tests/integration/capture/test_faults.py."""

from __future__ import annotations


import pytest

from qkplast.pipeline.cli import main



@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    files = {
        "malformed.jsonl": '{"id": "a", "text": "fine"}\n{"id": "b", "text": \n',
        "no-text-field.jsonl": '{"id": "a", "body": "no text field here"}\n',
        "not-an-object.jsonl": '["a", "list"]\n',
        "empty.jsonl": "",
        "table.csv": "a,b\n1,2\n",
        "study-bad-yaml.yaml": "name: [unclosed\n",
        "study-not-mapping.yaml": "- just\n- a list\n",
        "study-unknown-key.yaml": "name: s\nmodels: [{id: smollm2-135m, seq_lenx: 3}]\n",
        "study-bad-resources.yaml": "name: s\nresources: {gpus: many}\nmodels: [{id: smollm2-135m}]\n",
        "study-floating.yaml": "name: s\nmodels: [{id: owner/model@main}]\n",
        "study-no-models.yaml": "name: s\nmodels: []\n",
        "not-a-capture.nc": "this is not netCDF",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "latin1.txt").write_bytes("caf\xe9 ol\xe9 ".encode("latin-1") * 50)
    (root / "empty-dir").mkdir()
    return root


@pytest.fixture
def no_weights(monkeypatch):
    """Loading weights fails the test: every refusal below must come before it."""
    import qkplast.capture.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("weights loaded before the refusal"))
    monkeypatch.setattr(models, "load_for", lambda *a, **k: pytest.fail("weights loaded before the refusal"))


def _one_line(capsys, argv) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, code, err)
    assert lines[0].startswith(f"qkplast {argv[0]}: error: "), lines
    return lines[0]


CORPUS_CASES = [
    ("malformed.jsonl", "malformed.jsonl"),
    ("no-text-field.jsonl", "text"),
    ("not-an-object.jsonl", "not-an-object.jsonl"),
    ("empty.jsonl", "empty.jsonl"),
    ("table.csv", ".txt or .jsonl"),
    ("latin1.txt", "latin1.txt"),
    ("empty-dir", "no .txt or .jsonl"),
    ("missing.jsonl", "no such file"),
]


@pytest.mark.parametrize("command", ["capture", "plan", "run"])
@pytest.mark.parametrize("corpus, needle", CORPUS_CASES)
def test_a_bad_corpus_file_is_one_line_before_any_weights(command, corpus, needle, model_dir, bad_files, tmp_path,
                                                         capsys, no_weights):
    argv = [command, "--model", model_dir, "--corpus", bad_files / corpus, "--seq-len", 64, "--bucket-size", 16,
            "--samples-per-bucket", 2, "--docs", 2]
    argv += {"capture": ["--out", tmp_path / "c.nc"], "plan": [], "run": ["--out", tmp_path / "run"]}[command]
    line = _one_line(capsys, argv)
    assert needle in line, line
    assert not (tmp_path / "c.nc").exists()


@pytest.mark.parametrize("command", ["capture", "plan", "run"])
@pytest.mark.parametrize("flags, needle", [
    (["--model", "nobody/nothing"], "nobody/nothing"),
    (["--model", "/no/such/dir"], "/no/such/dir"),
    (["--rope-scaling", "yarn"], "--rope-scaling"),
    (["--rope-scaling", "spline:4"], "--rope-scaling"),
    (["--device", "cuda"], "no CUDA device"),
    (["--device", "tpu:3"], "device"),
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--attn", "flash"], "invalid choice: 'flash'"),
    (["--heads", "0"], "heads must be >= 1"),
    (["--docs", "-2"], "docs must be >= 1"),
    (["--seq-len", "1000000"], "exceeds the model's maximum"),
    (["--samples-per-bucket", "0"], "samples_per_bucket must be > 0"),
    (["--seed", "x"], "seed expects int"),
])
def test_a_bad_flag_value_is_one_line_before_any_weights(command, flags, needle, model_dir, tmp_path, capsys,
                                                        no_weights):
    base = {"--model": model_dir, "--corpus": "pydoc-topics", "--short-docs": "concat", "--seq-len": 64,
            "--bucket-size": 16, "--samples-per-bucket": 2, "--docs": 2}
    base.update(dict(zip(flags[::2], flags[1::2])))
    argv = [command, *[x for kv in base.items() for x in kv]]
    argv += {"capture": ["--out", tmp_path / "c.nc"], "plan": [], "run": ["--out", tmp_path / "run"]}[command]
    if command == "plan" and flags[0] == "--device" and flags[1] == "cuda":
        pytest.skip("plan plans for a CUDA device that is not here (its purpose)")
    line = _one_line(capsys, argv)
    assert needle in line, line


@pytest.mark.parametrize("study, needle", [
    ("study-bad-yaml.yaml", "not valid YAML"),
    ("study-not-mapping.yaml", "expected a mapping"),
    ("study-unknown-key.yaml", "seq_lenx"),
    ("study-bad-resources.yaml", "gpus must be a non-negative number"),
    ("study-floating.yaml", "allow_floating"),
    ("study-no-models.yaml", "missing 'models'"),
    ("missing.yaml", "does not exist"),
])
@pytest.mark.parametrize("mode", [[], ["--status"], ["--validate"], ["--dry-run", "--executor", "slurm"]])
def test_a_bad_study_file_is_one_line(study, needle, mode, bad_files, capsys, no_weights):
    line = _one_line(capsys, ["study", bad_files / study, *mode])
    assert needle in line, line


@pytest.mark.parametrize("argv, needle", [
    (["analyze", "{bad}/not-a-capture.nc", "--out", "{tmp}/m.nc"], "not-a-capture.nc"),
    (["analyze", "{bad}/missing.nc", "--out", "{tmp}/m.nc"], "missing.nc"),
    (["analyze", "{bad}/table.csv", "--out", "{tmp}/m.nc"], "table.csv"),
    (["analyze", "{bad}/not-a-capture.nc", "--out", "{tmp}/m.nc", "--n-pairs", "0"], "n_pairs"),
    (["compare", "{tmp}/no-run"], "no-run"),
    (["compare", "{bad}/empty-dir"], "empty-dir"),
    (["compare", "{bad}/study-unknown-key.yaml"], "seq_lenx"),
])
def test_analyze_and_compare_refuse_bad_input_in_one_line(argv, needle, bad_files, tmp_path, capsys):
    line = _one_line(capsys, [a.format(bad=bad_files, tmp=tmp_path) for a in argv])
    assert needle in line, line


def test_a_capture_stage_after_a_job_killed_while_clearing_its_parts_clears_the_rest(tmp_path, no_weights):
    # Seen in the requeue test: a timed-out job wrote capture.nc (atomically), was killed while deleting
    # capture.nc.parts (its manifest and some windows already gone), and the next attempt found the capture done,
    # so it never went through the capture that clears the parts. Every attempt now clears them.
    from qkplast.options import AnalysisOptions, CaptureOptions
    from qkplast.pipeline.stages import Target, capture_stage
    from qkplast.rundir.products import write_manifest

    options = CaptureOptions(model="smollm2-135m", docs=2)
    run = tmp_path / "run"
    run.mkdir()
    write_manifest(run, {"capture": options.to_dict(), "status": "captured"})
    (run / "capture.nc").write_bytes(b"the finished capture")
    parts = run / "capture.nc.parts"
    parts.mkdir()
    for i in range(3):  # what the interrupted deletion left
        (parts / f"doc-{i:06d}.nc").write_bytes(b"part")
    assert capture_stage([Target(run, options)], AnalysisOptions(), progress=False) == 0  # no model loaded
    assert not parts.exists() and (run / "capture.nc").read_bytes() == b"the finished capture"
    (run / "capture.nc").unlink()  # without the capture, parts are a run to resume: never deleted
    parts.mkdir()
    (parts / "doc-000000.nc").write_bytes(b"part")
    from qkplast.rundir.products import clear_leftover_parts

    assert not clear_leftover_parts(run) and (parts / "doc-000000.nc").exists()
