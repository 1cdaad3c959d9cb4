"""Options: one typed CaptureOptions and AnalysisOptions; bad values fail with a QkplastError naming the field."""

from dataclasses import fields

import pytest

from qkplast import AnalysisOptions, CaptureOptions
from qkplast.errors import QkplastError
from qkplast.options import PRESETS, OptionsError, UnknownOptionError, typed_option


def test_defaults_are_the_default_run():
    """SmolLM2 across its 8192-token window, 16 buckets of 512, single long documents, 32 queries per bucket."""
    c = CaptureOptions()
    assert (c.model, c.corpus, c.seq_len, c.bucket_size, c.short_docs) == ("smollm2-135m", "python-docs", 8192, 512,
                                                                            "skip")
    assert c.seq_len // c.bucket_size == 16 and c.docs * c.samples_per_bucket >= 32
    fast = PRESETS["fast"]
    assert fast.seq_len == 2048 and fast.seq_len // fast.bucket_size == 16 and fast.docs * fast.samples_per_bucket >= 32
    assert PRESETS["default"] == c


@pytest.mark.parametrize("cls, name, text, value", [
    (CaptureOptions, "seq_len", "131072", 131072),
    (CaptureOptions, "seq_len", "none", None),
    (CaptureOptions, "heads", "all", None),
    (CaptureOptions, "samples_per_bucket", "2", 2.0),
    (CaptureOptions, "allow_unverified", "yes", True),
    (CaptureOptions, "rope_scaling", "yarn:4:32768", "yarn:4:32768"),
    (AnalysisOptions, "n_pairs", "512", 512),
    (AnalysisOptions, "mc_unbiased", "false", False),
    (AnalysisOptions, "edge_fraction", "0.25", 0.25),
    (AnalysisOptions, "covariance", "full", "full"),
])
def test_text_is_typed_from_the_field(cls, name, text, value):
    got = typed_option(cls, name, text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("cls, kwargs, match", [
    (CaptureOptions, {"seq_len": "long"}, "seq_len expects int or none, got 'long'"),
    (CaptureOptions, {"docs": 2.5}, "docs expects int or none"),
    (CaptureOptions, {"heads": True}, "heads expects int"),
    (CaptureOptions, {"dtype": "float64"}, "dtype='float64' is not one of"),
    (CaptureOptions, {"seq_len": 1024, "bucket_size": 2048}, "bucket_size 2048 exceeds seq_len 1024"),
    (AnalysisOptions, {"n_pairs": "many"}, "n_pairs expects int"),
    (AnalysisOptions, {"mc_unbiased": "maybe"}, "mc_unbiased expects bool"),
])
def test_wrong_types_and_values_are_one_error_type(cls, kwargs, match):
    with pytest.raises(OptionsError, match=match) as info:
        cls(**kwargs)
    assert isinstance(info.value, QkplastError) and isinstance(info.value, ValueError)


def test_numbers_are_coerced_to_the_field_type():
    c = CaptureOptions(samples_per_bucket=4, seq_len=4096.0, bucket_size=256)
    assert type(c.samples_per_bucket) is float and type(c.seq_len) is int


def test_unknown_names_are_type_errors_and_qkplast_errors():
    for cls in (CaptureOptions, AnalysisOptions):
        with pytest.raises(UnknownOptionError, match="unknown") as info:
            cls.from_kwargs(None, sequence_length=3)
        assert isinstance(info.value, TypeError) and isinstance(info.value, QkplastError)


def test_capture_options_round_trip_through_their_dict():
    c = CaptureOptions(model="Qwen/Qwen3-8B@abc123", rope_scaling="yarn:4:32768", seq_len=131072, bucket_size=8192,
                       heads=None)
    assert CaptureOptions(**c.to_dict()) == c
    assert list(c.to_dict()) == [f.name for f in fields(CaptureOptions)]
    assert "device" not in c.result_key()


def test_package_errors_share_one_base():
    from qkplast.rundir import RunError
    from qkplast.capture.corpus import CorpusError
    from qkplast.capture_format import CaptureError
    from qkplast.capture.models import ModelError

    for error in (CaptureError, CorpusError, ModelError, RunError, OptionsError, UnknownOptionError):
        assert issubclass(error, QkplastError), error
