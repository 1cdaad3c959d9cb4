"""Command line: analyze writes the same metrics as the API and refuses to overwrite."""

import warnings

import pytest

import qkplast
from qkplast.cli import main
from qkplast.plasticity import PlasticityWarning
from qkplast.synthetic import planted_capture


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


def test_analyze_refuses_overwrite(capture_file, tmp_path, capsys):
    _, path = capture_file
    out = tmp_path / "metrics.nc"
    out.write_text("keep me")
    assert main(["analyze", str(path), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "keep me"


def test_analyze_missing_capture(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.nc"), "--out", str(tmp_path / "m.nc")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_bad_choice_is_rejected(capture_file, tmp_path):
    _, path = capture_file
    with pytest.raises(SystemExit):
        main(["analyze", str(path), "--out", str(tmp_path / "m.nc"), "--covariance", "banded"])


def test_theory_command(capsys):
    assert main(["theory"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 4


def test_run_parameter_values_are_python_literals():
    from qkplast.batch import _literal

    assert _literal("16") == 16 and _literal("0.5") == 0.5 and _literal("True") is True and _literal("none") is None
    assert _literal("['a@r1', 'b']") == ["a@r1", "b"] and _literal('{"covariance": "full"}') == {"covariance": "full"}
    assert _literal("stdlib-code") == "stdlib-code" and _literal("yarn:4:32768") == "yarn:4:32768"
