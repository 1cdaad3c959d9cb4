"""qkplast train: bad input is one line on stderr and exit 2, before anything is trained or written."""

import json

import pytest

from qkplast.pipeline.cli import main


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], "steps must be >= 1"),
    (["--steps", "abc"], "argument --steps: option steps expects int"),
    (["--arms", "rescaled,sideways"], "arms must be distinct names"),
    (["--preset", "huge"], "argument --preset: invalid choice"),
    (["--corpus", "/no/such/corpus"], "unknown corpus '/no/such/corpus'"),
    (["--batch", "6"], "multiple of ext_factor"),
    (["--warmup", "999"], "warmup (999) must be >= 0 and shorter than steps (240)"),
    (["--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    (["--copy-share", "2"], "copy_share must lie in [0, 1]"),
    (["--ext-from", "predecay"], "ext_from 'predecay' needs schedule 'wsd'"),
    (["--corpus", "python-docs+/no/such/corpus"], "unknown corpus '/no/such/corpus'"),
])
def test_bad_flags(tmp_path, capsys, argv, words):
    out = tmp_path / "train"
    assert main(["train", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkplast train: error: ") and words in err and err.count("\n") == 1
    assert not out.exists()  # nothing written before the input is known to be good


def test_bad_study_file_and_missing_out(tmp_path, capsys):
    study = tmp_path / "s.yaml"
    study.write_text("name: s\ntrain: {stepz: 1}\n")
    assert main(["train", str(study), "--out", str(tmp_path / "o")]) == 2
    assert "unknown training setting(s) ['stepz']" in capsys.readouterr().err
    study.write_text("name: s\n")
    assert main(["train", str(study)]) == 2
    assert "no output directory: pass --out DIR" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_directory_trained_with_other_settings_is_refused(tmp_path, capsys):
    from qkplast.train import PRESETS

    out = tmp_path / "train"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(PRESETS["smoke"].to_dict()))
    assert main(["train", "--preset", "smoke", "--steps", str(PRESETS["smoke"].steps + 1), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a training with other settings (steps differ)" in err and err.count("\n") == 1
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert json.loads((out / "config.json").read_text())["steps"] == PRESETS["smoke"].steps  # the recorded training is untouched


def test_device_cuda_without_a_gpu_is_one_line_before_anything_is_written(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "train"
    assert main(["train", "--preset", "smoke", "--device", "cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkplast train: error: device 'cuda' requested") and err.count("\n") == 1
    assert not out.exists()
