"""Results over checkpoints loaded from disk: the trajectory table, and a second call reuses what the first computed."""

import warnings

import pytest

from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.options import CaptureOptions
from qkplast.results import tables as results
from qkplast.rundir import checkpoint_metrics


def test_checkpoint_metrics_over_local_checkpoints(tmp_path, monkeypatch):
    import torch
    import transformers as T
    from tests.helpers import COMMON, tiny_tokenizer

    ckpts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = tmp_path / f"step-{seed}"
        T.LlamaForCausalLM(T.LlamaConfig(**COMMON)).save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
        ckpts.append(str(path))
    params = dict(corpus="pydoc-topics", docs=4, seq_len=128, bucket_size=16, samples_per_bucket=3, heads=6, seed=0,
                  device="cpu", dtype="auto", rope_scaling=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        got = checkpoint_metrics(ckpts, tmp_path / "run", CaptureOptions(**params))
    assert list(got) == ckpts
    table = results.trajectory_table(got)
    assert table.shape == (2, 6) and table.iloc[0]["bias_str"] != table.iloc[1]["bias_str"]
    import qkplast.capture.driver

    monkeypatch.setattr(qkplast.capture.driver, "run_capture", lambda *a, **k: pytest.fail("recaptured"))
    again = checkpoint_metrics(ckpts, tmp_path / "run", CaptureOptions(**params))
    assert again[ckpts[0]].identical(got[ckpts[0]])
