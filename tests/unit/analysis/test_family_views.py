"""What the analyses read of the new families' captures (qkplast.analysis.vectors), and the format that carries it.

Planted captures (:func:`qkplast.theory.planted.planted_capture`) stand in for
the families: a GPT-NeoX capture is a planted one whose ``rotary`` coordinate
marks the first quarter of each head, a Ministral-3 capture one whose queries
were multiplied by a planted position factor. Each option is checked against
the same computation done by hand (the dims cut out, the factor divided out
beforehand), and the defaults against the capture without the coordinates,
which is what the thesis's families had.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from qkplast.analysis.metrics import analyze
from qkplast.analysis.vectors import analysis_vectors, rotary_mask
from qkplast.capture_format import CaptureError, validate_capture
from qkplast.options import AnalysisOptions, CaptureOptions, OptionsError
from qkplast.theory.planted import planted_capture

FAST = dict(open_questions=False, n_pairs=64)
METRICS = ("bias_strength", "key_position_slope", "r_q_a", "ap_overall", "ap_first20", "ap_last20", "ap_drop",
           "explained_variance_ratio")


@pytest.fixture(scope="module")
def planted() -> xr.Dataset:
    capture, _ = planted_capture(n_heads=3, dim=16, seq_len=2048, bucket_size=128, n_docs=8, samples_per_bucket=4)
    return capture


def _factor(position: np.ndarray, beta: float = 0.3, original: int = 512) -> np.ndarray:
    """A Llama-4 style query factor with steps inside the planted window: 1 + beta log(1 + floor(t / original))."""
    return 1.0 + beta * np.log1p(position // original)


def _same(a: xr.Dataset, b: xr.Dataset) -> None:
    for name in METRICS:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)


def test_defaults_leave_the_capture_untouched(planted):
    scaled = planted.assign_coords(rotary=("dim", np.arange(16) < 4),
                                   query_scale=("sample", _factor(planted.position.values)))
    assert analysis_vectors(planted, AnalysisOptions()) is planted
    assert analysis_vectors(scaled, AnalysisOptions()) is scaled


def test_defaults_do_not_change_results_of_the_existing_families(planted):
    """A capture of an existing family now carries rotary (all True); its metrics are those of the capture without."""
    marked = planted.assign_coords(rotary=("dim", np.ones(16, bool)))
    _same(analyze(marked, open_questions=True), analyze(planted, open_questions=True))
    for option in ({"head_dims": "rotary"}, {"query_scale": "divided_out"}):  # nothing to cut, no factor: same again
        _same(analyze(marked, **FAST, **option), analyze(planted, **FAST))


def test_query_scale_divided_out_equals_dividing_by_hand(planted):
    factor = _factor(planted.position.values)  # [sample]
    assert factor.max() > 1.4
    scaled = planted.assign(q=planted.q * factor[None, :, None]).assign_coords(query_scale=("sample", factor))
    divided = analyze(scaled, **FAST, query_scale="divided_out")
    by_hand = analyze(planted.assign(q=scaled.q / factor[None, :, None]), **FAST)
    for name in METRICS:
        np.testing.assert_allclose(divided[name].values, by_hand[name].values, rtol=1e-9, atol=1e-12, err_msg=name)
    as_captured = analyze(scaled, **FAST)  # the default keeps the factor: the queries as the kernel scores them
    assert not np.allclose(as_captured.bias_strength.values, divided.bias_strength.values, rtol=1e-3)
    assert divided.attrs["options"]["query_scale"] == "divided_out"


@pytest.mark.parametrize("head_dims, kept", [("rotary", slice(0, 4)), ("non_rotary", slice(4, 16))])
def test_head_dims_equal_cutting_the_dims_by_hand(planted, head_dims, kept):
    neox = planted.assign_coords(rotary=("dim", np.arange(16) < 4))  # GPT-NeoX: the first quarter rotates
    view = analysis_vectors(neox, AnalysisOptions(head_dims=head_dims))
    assert view.sizes["dim"] == kept.stop - kept.start
    _same(analyze(neox, **FAST, head_dims=head_dims), analyze(planted.isel(dim=kept), **FAST))


def test_views_are_idempotent_and_refuse_an_empty_selection(planted):
    neox = planted.assign_coords(rotary=("dim", np.arange(16) < 4),
                                 query_scale=("sample", _factor(planted.position.values)))
    options = AnalysisOptions(head_dims="non_rotary", query_scale="divided_out")
    once = analysis_vectors(neox, options)
    twice = analysis_vectors(once, options)
    xr.testing.assert_identical(once, twice)
    assert (once.query_scale.values == 1).all() and not once.rotary.values.any()
    with pytest.raises(OptionsError, match="every dimension of this capture rotates"):
        analysis_vectors(planted, AnalysisOptions(head_dims="non_rotary"))
    with pytest.raises(OptionsError, match="no dimension of this capture rotates"):
        analysis_vectors(once, AnalysisOptions(head_dims="rotary"))
    assert rotary_mask(planted).all() and rotary_mask(neox).sum() == 4


def test_unknown_choices_are_refused():
    with pytest.raises(OptionsError, match="head_dims"):
        AnalysisOptions(head_dims="first_quarter")
    with pytest.raises(OptionsError, match="query_scale"):
        AnalysisOptions(query_scale="removed")
    assert AnalysisOptions().head_dims == "all" and AnalysisOptions().query_scale == "as_captured"


# --------------------------------------------------------------------------- the format (qkplast.capture_format)


def test_optional_coords_are_validated_where_present(planted):
    validate_capture(planted)  # a capture without them (made before them) stays valid
    validate_capture(planted.assign_coords(rotary=("dim", np.arange(16) < 4),
                                           query_scale=("sample", _factor(planted.position.values))))
    bad = {
        "'rotary' must be boolean": planted.assign_coords(rotary=("dim", np.arange(16))),
        "'rotary' must have dims": planted.assign_coords(rotary=("sample", np.ones(planted.sizes["sample"], bool))),
        "'query_scale' must be floating": planted.assign_coords(query_scale=("sample", np.ones(planted.sizes["sample"], int))),
        "finite positive": planted.assign_coords(query_scale=("sample", -np.ones(planted.sizes["sample"]))),
    }
    for message, ds in bad.items():
        with pytest.raises(CaptureError, match=message):
            validate_capture(ds)


def test_optional_coords_round_trip_through_a_file(planted, tmp_path):
    from qkplast.capture_format import open_capture, save_capture

    marked = planted.assign_coords(rotary=("dim", np.arange(16) < 4),
                                   query_scale=("sample", _factor(planted.position.values)))
    back = open_capture(save_capture(marked, tmp_path / "c.nc"))
    assert back.rotary.dtype == bool and back.rotary.values.tolist() == marked.rotary.values.tolist()
    np.testing.assert_array_equal(back.query_scale.values, marked.query_scale.values)


# --------------------------------------------------------------------------- the tokenizer option


def test_tokenizer_option_is_typed_and_recorded_under_its_name():
    assert CaptureOptions().tokenizer is None
    options = CaptureOptions(tokenizer="HuggingFaceTB/SmolLM3-3B@main")
    assert options.to_dict()["tokenizer"] == "HuggingFaceTB/SmolLM3-3B@main"
    assert "tokenizer" in options.result_key()  # another tokenizer is another capture (parts are not reused)
    from qkplast.options import typed_option

    assert typed_option(CaptureOptions, "tokenizer", "none") is None


def test_bad_tokenizer_specs_are_one_line_errors(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from qkplast.capture.models import ModelError, load_tokenizer

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    with pytest.raises(ModelError, match="has none of") as info:
        load_tokenizer("any/model", tokenizer=str(empty), local_files_only=True)
    assert "\n" not in str(info.value)
    with pytest.raises(ModelError, match="unknown tokenizer"):
        load_tokenizer("any/model", tokenizer="not a hub id", local_files_only=True)
    cached = tmp_path / "hub" / "models--owner--base"  # a cached repository without the named revision
    (cached / "refs").mkdir(parents=True)
    (cached / "refs" / "main").write_text("0" * 40)
    with pytest.raises(ModelError, match="huggingface-cli download owner/base --revision v2") as info:
        load_tokenizer("any/model", tokenizer="owner/base@v2", local_files_only=True)
    assert str(info.value).startswith("tokenizer: revision 'v2'") and "\n" not in str(info.value)


def test_study_entries_accept_the_tokenizer(tmp_path):
    from qkplast.rundir.study_file import parse_study

    study = parse_study({"name": "s", "allow_floating": True, "defaults": {"tokenizer": "owner/base@abc"},
                         "models": [{"id": "owner/ckpts@step-1"}, {"id": "owner/other", "tokenizer": None}]},
                        tmp_path / "s.yaml")
    assert [r.capture.tokenizer for r in study.runs] == ["owner/base@abc", None]
