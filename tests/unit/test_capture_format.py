"""The capture contract: validation errors name the problem; storage round-trips exactly and atomically."""

import numpy as np
import pytest
import xarray as xr

import qkplast
from qkplast.capture_format import CaptureError, save_dataset, validate_capture
from qkplast.theory.planted import planted_capture


@pytest.fixture
def cap():
    capture, _ = planted_capture(n_heads=3, dim=8, seq_len=512, bucket_size=64, n_docs=3, samples_per_bucket=2)
    capture = capture.assign_coords(doc=("sample", np.where(capture.doc.values == "doc-000", "Ünïcode id / with spaces", capture.doc.values)))
    capture.attrs.update(flag=True, nothing=None, nested={"a": [1, 2.5, "x"]})
    return capture.astype({"q": "float32", "k": "float32"})


def test_round_trip_is_exact(cap, tmp_path):
    path = qkplast.save_capture(cap, tmp_path / "c.nc")
    back = qkplast.open_capture(path)
    xr.testing.assert_identical(back, cap)
    assert back.attrs == cap.attrs and back["rope"].dtype == bool and back["doc"].dtype.kind == "U"


def test_refuses_overwrite_and_keeps_existing(cap, tmp_path):
    path = qkplast.save_capture(cap, tmp_path / "c.nc")
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="overwrite"):
        qkplast.save_capture(cap.isel(head=[0]), path)
    assert path.read_bytes() == before
    qkplast.save_capture(cap.isel(head=[0]), path, overwrite=True)
    assert qkplast.open_capture(path).sizes["head"] == 1


def test_failed_write_leaves_nothing_and_keeps_existing(cap, tmp_path, monkeypatch):
    path = qkplast.save_capture(cap, tmp_path / "c.nc")
    before = path.read_bytes()

    def boom(self, target, **kw):
        open(target, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(xr.Dataset, "to_netcdf", boom)
    with pytest.raises(OSError, match="disk full"):
        qkplast.save_capture(cap, path, overwrite=True)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.nc"]


def test_unwritable_directory(cap, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        qkplast.save_capture(cap, tmp_path / "missing" / "c.nc")


def test_attrs_must_be_json(cap, tmp_path):
    cap.attrs["bad"] = object()
    with pytest.raises(CaptureError, match="JSON"):
        save_dataset(cap, tmp_path / "c.nc")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.drop_vars("k"), "no data variable 'k'"),
        (lambda d: d.assign(q=d.q.transpose("sample", "head", "dim")), "dims"),
        (lambda d: d.rename({"doc": "document"}), "no coordinate 'doc'"),
        (lambda d: d.assign_coords(bucket=("sample", d.bucket.values + 1)), "bucket != position // bucket_size"),
        (lambda d: d.assign_coords(kv_head=("head", np.array([2, 0, 0]))), "GQA mapping"),
        (lambda d: d.assign_coords(position=("sample", d.position.values + 10_000)), r"positions must lie in"),
        (lambda d: d.assign_coords(doc=("sample", np.full(d.sizes["sample"], "same"))).assign_coords(
            position=("sample", np.zeros(d.sizes["sample"], int)), bucket=("sample", np.zeros(d.sizes["sample"], int))),
         "appears more than once"),
        (lambda d: d.assign_coords(rope=("head", np.array([1, 1, 0]))), "'rope' must be boolean"),
        (lambda d: d.drop_attrs(deep=False), "attrs lack"),
    ],
)
def test_contract_violations_are_named(cap, mutate, message):
    bad = mutate(cap.copy())
    with pytest.raises(CaptureError, match=message):
        validate_capture(bad)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_and_inf_name_head_and_sample(cap, value):
    q = cap.q.values.copy()
    q[1, 5, 2] = value
    with pytest.raises(CaptureError, match=r"head 1 \(layer 0, q_head 1\), sample 5"):
        validate_capture(cap.assign(q=(cap.q.dims, q)))


def test_open_rejects_foreign_file(tmp_path):
    path = tmp_path / "foreign.nc"
    xr.Dataset({"x": ("a", np.arange(3))}).to_netcdf(path, engine="h5netcdf")
    with pytest.raises(CaptureError, match="not written by qkplast"):
        qkplast.open_capture(path)


def test_read_attrs_reads_a_files_attributes_without_its_data(tmp_path):
    import xarray as xr

    from qkplast.capture_format import open_dataset, read_attrs, save_dataset

    ds = xr.Dataset({"x": ("a", np.arange(3.0))}, attrs={"cache_key": '{"schema": 1}', "nested": {"a": [1, 2]}})
    path = save_dataset(ds, tmp_path / "p.nc")
    assert read_attrs(path) == open_dataset(path).attrs == {"cache_key": '{"schema": 1}', "nested": {"a": [1, 2]}}
    (tmp_path / "bad.nc").write_bytes(b"not netcdf")
    assert read_attrs(tmp_path / "bad.nc") is None and read_attrs(tmp_path / "missing.nc") is None
