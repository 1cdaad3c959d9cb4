"""Command line: analyze writes the same metrics as the API and refuses to overwrite; every user error is one
line on stderr with exit status 2 and no traceback; capture flags come from CaptureOptions."""

import warnings

import pytest

import qkplast
from qkplast.pipeline.cli import main
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.theory.planted import planted_capture
from tests.helpers import one_line_error


@pytest.fixture
def capture_file(tmp_path):
    cap, _ = planted_capture(n_heads=2, dim=8, seq_len=1024, bucket_size=128, n_docs=6, samples_per_bucket=2)
    return cap, qkplast.save_capture(cap, tmp_path / "cap.nc")


def test_analyze_matches_api(capture_file, tmp_path, capsys):
    cap, path = capture_file
    out = tmp_path / "metrics.nc"
    assert main(["analyze", str(path), "--out", str(out), "--n-pairs", "32", "--covariance", "full"]) == 0
    assert "wrote" in capsys.readouterr().out
    got = qkplast.open_dataset(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        want = qkplast.analyze(qkplast.open_capture(path), n_pairs=32, covariance="full")
    assert got.identical(want)
    assert got.attrs["options"]["covariance"] == "full"


def test_run_flags_reach_the_runs_capture_and_analysis_options(tmp_path, monkeypatch, capsys):
    """``qkplast run --n-pairs 32 --seq-len 256``: the analysis flag reaches the run's AnalysisOptions and the capture
    flag its CaptureOptions, by the fields' own names (the run itself is recorded, not made)."""
    from qkplast.pipeline import stages

    seen = {}

    def run(capture, out, **kwargs):
        seen.update(capture=capture, **kwargs)
        return stages.RunResult(tmp_path, {"timings_s": {}, "notebooks": []})

    monkeypatch.setattr(stages, "run", run)
    assert main(["run", "--n-pairs=32", "--seq-len", "256", "--bucket-size", "16", "--out", str(tmp_path / "r"),
                 "--no-progress"]) == 0
    assert seen["analysis"].n_pairs == 32 and seen["capture"].seq_len == 256 and seen["capture"].bucket_size == 16
    assert seen["analysis"].seed == seen["capture"].seed  # the analysis takes the capture's seed


def test_analyze_refuses_overwrite(capture_file, tmp_path, capsys):
    _, path = capture_file
    out = tmp_path / "metrics.nc"
    out.write_text("keep me")
    assert main(["analyze", str(path), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "keep me"


def test_analyze_missing_capture(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.nc"), "--out", str(tmp_path / "m.nc")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_bad_choice_is_rejected(capture_file, tmp_path, capsys):
    _, path = capture_file
    one_line_error(capsys, ["analyze", str(path), "--out", str(tmp_path / "m.nc"), "--covariance", "banded"],
                    "invalid choice: 'banded'", "--help")


@pytest.mark.parametrize("content", [b"not a netcdf file\n", b"\x89HDF\r\n\x1a\n" + b"\0" * 64])
def test_corrupt_or_foreign_file_is_one_line(tmp_path, capsys, content):
    bad = tmp_path / "bad.nc"
    bad.write_bytes(content)
    one_line_error(capsys, ["analyze", str(bad), "--out", str(tmp_path / "m.nc")], "bad.nc", "not a readable netCDF-4")
    assert not (tmp_path / "m.nc").exists()


def test_truncated_capture_is_one_line(capture_file, tmp_path, capsys):
    _, path = capture_file
    cut = tmp_path / "cut.nc"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    one_line_error(capsys, ["analyze", str(cut), "--out", str(tmp_path / "m.nc")], "cut.nc")


@pytest.mark.parametrize("argv, needles", [
    (["run", "-p", "nonsense", "3"], ["unknown parameter 'nonsense'", "seq_len", "covariance", "n_boot"]),
    (["run", "-p", "seq_len", "abc"], ["seq_len expects int", "'abc'"]),
    (["run", "-p", "docs", "2.5"], ["docs expects int"]),
    (["run", "-p", "mc_unbiased", "maybe"], ["mc_unbiased expects bool"]),
    (["run", "-p", "n_boot", "many"], ["n_boot expects int"]),
    (["run", "--seq-len", "long"], ["--seq-len", "seq_len expects int"]),
    (["run", "--bucket-size", "4096", "--seq-len", "2048"], ["bucket_size 4096 exceeds seq_len 2048"]),
    (["capture", "--out", "x.nc", "--short-docs", "merge"], ["invalid choice: 'merge'"]),
    (["plan", "--samples-per-bucket", "-1"], ["samples_per_bucket must be > 0"]),
    (["run", "--jobs", "0"], ["--jobs", "at least 1, got 0"]),
    (["run", "--jobs", "two"], ["--jobs", "at least 1, got 'two'"]),
])
def test_bad_flags_and_parameters_are_one_line(capsys, argv, needles):
    one_line_error(capsys, argv, *needles)


def test_revision_not_found_offline_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    one_line_error(capsys, ["capture", "--out", str(tmp_path / "c.nc"), "--model", "nobody/nothing@no-such-branch",
                             "--corpus", "pydoc-topics", "--seq-len", "128", "--bucket-size", "8", "--docs", "1"],
                    "nobody/nothing")
    assert not (tmp_path / "c.nc").exists()


def test_capture_flags_are_the_capture_options():
    from dataclasses import fields

    from qkplast import CaptureOptions
    from qkplast.pipeline.cli import build_parser

    parser = build_parser()
    for command in ("capture", "run", "plan"):
        sub = parser._subparsers._group_actions[0].choices[command]
        flags = {s for a in sub._actions for s in a.option_strings}
        for f in fields(CaptureOptions):
            assert "--" + f.name.replace("_", "-") in flags, (command, f.name)


def test_capture_options_from_flags_preset_and_parameters():
    from qkplast.pipeline.cli_capture import capture_options
    from qkplast.pipeline.params import split_parameters
    from qkplast.pipeline.cli import build_parser
    from qkplast.options import PRESETS

    args = build_parser().parse_args(["run", "--preset", "fast", "--seq-len", "1024", "--heads", "all",
                                      "--rope-scaling", "yarn:4:32768", "--revision", "main", "-p", "docs", "3",
                                      "-p", "covariance", "full", "-p", "n_boot", "100"])
    cap, ana, nb = split_parameters(args.parameter, {"n_boot": 40, "run_dir": "x"})
    assert cap == {"docs": 3} and ana == {"covariance": "full"} and nb == {"n_boot": 100}
    options = capture_options(args, **cap)
    assert options.seq_len == 1024 and options.heads is None and options.docs == 3
    assert options.rope_scaling == "yarn:4:32768" and options.revision == "main"
    assert options.corpus == PRESETS["fast"].corpus and options.bucket_size == PRESETS["fast"].bucket_size
    # a flag not given keeps the preset's value, not the dataclass default
    assert build_parser().parse_args(["capture", "--out", "x"]).preset == "default"


def test_theory_command(capsys):
    assert main(["theory"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 4


def test_run_parameter_values_are_python_literals():
    from qkplast.pipeline.params import parse_literal as _literal

    assert _literal("16") == 16 and _literal("0.5") == 0.5 and _literal("True") is True and _literal("none") is None
    assert _literal("['a@r1', 'b']") == ["a@r1", "b"] and _literal('{"covariance": "full"}') == {"covariance": "full"}
    assert _literal("stdlib-code") == "stdlib-code" and _literal("yarn:4:32768") == "yarn:4:32768"
