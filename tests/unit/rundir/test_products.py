"""The run directory's one cache (qkplast.rundir.products.cached): a product is reused while its key holds, computed
again in place when only the code that made it changed (schema or provenance), kept beside another setting's, and
read once per process while its file is unchanged."""

from __future__ import annotations

import numpy as np
import xarray as xr

from qkplast.rundir import products
from qkplast.rundir.products import cached


def product(value: float) -> xr.Dataset:
    return xr.Dataset({"x": ("i", np.full(3, value))})


class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self, value):
        def compute():
            self.calls += 1
            return product(value)

        return compute


def key(setting=1, schema=1, provenance="a"):
    return {"schema": schema, "setting": setting, "provenance": {"source_sha256": provenance}}


def test_a_product_is_computed_once_then_read(tmp_path):
    count = Counter()
    first = cached(tmp_path, "thing", key(), count(1.0))
    again = cached(tmp_path, "thing", key(), count(2.0))
    assert count.calls == 1 and (tmp_path / "thing.nc").exists()
    np.testing.assert_array_equal(again.x.values, first.x.values)
    assert again.attrs["cache_key"] == first.attrs["cache_key"]


def test_other_code_recomputes_in_place_and_another_setting_goes_beside(tmp_path):
    count = Counter()
    cached(tmp_path, "thing", key(), count(1.0))
    for changed in (key(schema=2), key(schema=2, provenance="b")):  # the same setting made by other code
        cached(tmp_path, "thing", changed, count(3.0))
    assert count.calls == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["thing.nc"]
    other = cached(tmp_path, "thing", key(setting=2, schema=2, provenance="b"), count(5.0))
    assert count.calls == 4 and float(other.x[0]) == 5.0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0].startswith("thing-") and names[1] == "thing.nc"
    # both settings are read back, each from its own file
    assert float(cached(tmp_path, "thing", key(schema=2, provenance="b"), count(9.0)).x[0]) == 3.0
    assert float(cached(tmp_path, "thing", key(setting=2, schema=2, provenance="b"), count(9.0)).x[0]) == 5.0
    assert count.calls == 4


def test_a_file_is_read_once_per_process_and_each_reader_gets_its_own_copy(tmp_path, monkeypatch):
    cached(tmp_path, "thing", key(), Counter()(1.0))
    opened = []
    real = products.open_dataset

    def counting(path):
        opened.append(path)
        return real(path)

    monkeypatch.setattr(products, "open_dataset", counting)
    monkeypatch.setattr(products, "_READ", {})
    a = cached(tmp_path, "thing", key(), Counter()(0.0))
    b = cached(tmp_path, "thing", key(), Counter()(0.0))
    assert len(opened) == 1 and a is not b
    b.attrs["note"] = "mine"
    b["y"] = ("i", np.zeros(3))
    assert "note" not in a.attrs and "y" not in a
    # a file written again (another product in its place) is read again
    cached(tmp_path, "thing", key(schema=2), Counter()(4.0))
    c = cached(tmp_path, "thing", key(schema=2), Counter()(0.0))
    assert float(c.x[0]) == 4.0
