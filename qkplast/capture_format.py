"""The capture format: validation, exact round-trip storage of labelled datasets.

A *capture* is an :class:`xarray.Dataset` holding post-RoPE query and key
vectors (thesis section 4.1):

* ``q``, ``k`` with dims ``(head, sample, dim)``;
* coords on ``sample``: ``position`` (token index), ``doc`` (document id,
  string), ``bucket`` (``position // bucket_size``), ``token`` (token id);
* coords on ``head``: ``layer``, ``q_head``, ``kv_head`` (GQA key head,
  eq. 4.1), ``rope`` (False for layers without positional encoding);
* attrs: ``model``, ``seq_len``, ``bucket_size``, ``seed``, ``dtype``,
  ``corpus``, ``n_q_heads``, ``n_kv_heads`` plus anything that makes the run
  reproducible;
* optional (:data:`OPTIONAL_COORDS`; captures made before them lack them, and
  a missing one means the default): ``rotary`` on ``dim`` (boolean: the
  dimension is turned by the rotary embedding in the RoPE layers; default all
  True; GPT-NeoX turns only the first quarter of each head) and
  ``query_scale`` on ``sample`` (positive float: the position-dependent factor
  the model multiplied the queries by after RoPE, Ministral-3's Llama-4 style
  scale; default 1, no factor).

Datasets are stored as netCDF-4 (HDF5) files. netCDF attributes cannot hold
booleans, ``None`` or nested mappings, so every attribute is also stored as one
JSON document and restored from it on opening: what is saved is what is opened.
Writes go to a temporary file beside the target that is renamed into place only
once complete, so an interrupted write never leaves a file that looks valid
and never damages an existing one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from qkplast.errors import QkplastError

__all__ = [
    "CaptureError",
    "REQUIRED_ATTRS",
    "OPTIONAL_COORDS",
    "validate_capture",
    "save_capture",
    "open_capture",
    "save_dataset",
    "open_dataset",
    "read_attrs",
]

REQUIRED_ATTRS = ("model", "seq_len", "bucket_size", "seed", "dtype", "corpus", "n_q_heads", "n_kv_heads")
SAMPLE_COORDS = {"position": "i", "doc": "U", "bucket": "i", "token": "i"}
HEAD_COORDS = {"layer": "i", "q_head": "i", "kv_head": "i", "rope": "b"}
#: coordinates a capture may hold: name -> (dim, kind); absent means every dimension rotates / no query factor
OPTIONAL_COORDS = {"rotary": ("dim", "b"), "query_scale": ("sample", "f")}
_ATTRS_KEY = "_qkplast_attrs_json"
FORMAT_VERSION = 1


class CaptureError(QkplastError):
    """A capture or metrics dataset does not follow the documented contract."""


def _kind_ok(values: np.ndarray, kind: str) -> bool:
    if kind == "i":
        return values.dtype.kind in "iu"
    if kind == "b":
        return values.dtype.kind == "b"
    if kind == "f":
        return values.dtype.kind == "f"
    if kind == "U":
        return values.dtype.kind in "UO" and all(isinstance(v, str) for v in values.ravel().tolist())
    raise AssertionError(kind)


_KIND_WORDS = {"i": "integer", "b": "boolean", "U": "string", "f": "floating-point"}


def _check_coord(ds: xr.Dataset, name: str, dim: str, kind: str) -> None:
    if ds[name].dims != (dim,):
        raise CaptureError(f"coordinate {name!r} must have dims ({dim!r},), got {ds[name].dims}")
    if not _kind_ok(ds[name].values, kind):
        raise CaptureError(f"coordinate {name!r} must be {_KIND_WORDS[kind]}, got dtype {ds[name].dtype}")


def _check_optional_coords(ds: xr.Dataset) -> None:
    """``rotary`` and ``query_scale``, where present: right dim and kind, and factors finite and positive."""
    for name, (dim, kind) in OPTIONAL_COORDS.items():
        if name in ds.coords:
            _check_coord(ds, name, dim, kind)
    if "query_scale" in ds.coords:
        scale = ds["query_scale"].values
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            raise CaptureError("coordinate 'query_scale' must hold finite positive factors")


def _head_label(ds: xr.Dataset, i: int) -> str:
    return f"head {i} (layer {int(ds['layer'][i])}, q_head {int(ds['q_head'][i])})"


def validate_capture(ds: xr.Dataset, *, check_finite: bool = True) -> xr.Dataset:
    """Check that ``ds`` follows the capture contract; raise :class:`CaptureError` if not.

    Checks names, dims and dtypes (of the optional ``rotary`` and ``query_scale`` too, where present), the GQA
    mapping ``kv_head = q_head // (n_q/n_kv)``
    (eq. 4.1), ``bucket == position // bucket_size``, positions inside
    ``[0, seq_len)``, unique ``(doc, position)`` samples, and (unless
    ``check_finite=False``) that no vector holds NaN or Inf.

    Returns
    -------
    xarray.Dataset
        ``ds`` itself, so the call can be chained.
    """
    if not isinstance(ds, xr.Dataset):
        raise CaptureError(f"a capture must be an xarray.Dataset, got {type(ds).__name__}")
    for name in ("q", "k"):
        if name not in ds.data_vars:
            raise CaptureError(f"capture has no data variable {name!r}; it has {sorted(ds.data_vars)}")
        if ds[name].dims != ("head", "sample", "dim"):
            raise CaptureError(f"{name!r} must have dims ('head', 'sample', 'dim'), got {ds[name].dims}")
        if ds[name].dtype.kind != "f":
            raise CaptureError(f"{name!r} must hold floating-point vectors, got dtype {ds[name].dtype}")
    if ds["q"].shape != ds["k"].shape:
        raise CaptureError(f"'q' and 'k' shapes differ: {ds['q'].shape} vs {ds['k'].shape}")
    n_head, n_sample, n_dim = ds["q"].shape
    if n_head == 0 or n_sample == 0 or n_dim == 0:
        raise CaptureError(f"capture is empty: {n_head} heads, {n_sample} samples, {n_dim} dims")
    for coords, dim in ((SAMPLE_COORDS, "sample"), (HEAD_COORDS, "head")):
        for name, kind in coords.items():
            if name not in ds.coords:
                raise CaptureError(f"capture has no coordinate {name!r} on {dim!r}")
            _check_coord(ds, name, dim, kind)
    _check_optional_coords(ds)
    missing = [a for a in REQUIRED_ATTRS if a not in ds.attrs]
    if missing:
        raise CaptureError(f"capture attrs lack {missing}; required: {list(REQUIRED_ATTRS)}")
    seq_len, bucket_size = int(ds.attrs["seq_len"]), int(ds.attrs["bucket_size"])
    if bucket_size <= 0 or seq_len <= 0:
        raise CaptureError(f"seq_len ({seq_len}) and bucket_size ({bucket_size}) must be positive")
    pos = ds["position"].values
    if pos.min() < 0 or pos.max() >= seq_len:
        raise CaptureError(f"positions must lie in [0, seq_len={seq_len}), got [{pos.min()}, {pos.max()}]")
    bad = np.flatnonzero(ds["bucket"].values != pos // bucket_size)
    if bad.size:
        raise CaptureError(
            f"bucket != position // bucket_size ({bucket_size}) at {bad.size} samples, first sample {bad[0]} "
            f"(position {pos[bad[0]]}, bucket {ds['bucket'].values[bad[0]]})"
        )
    dup = pd.DataFrame({"doc": ds["doc"].values, "position": pos}).duplicated()
    if dup.any():
        s = int(np.flatnonzero(dup.to_numpy())[0])
        raise CaptureError(f"sample (doc {str(ds['doc'].values[s])!r}, position {pos[s]}) appears more than once")
    n_q, n_kv = int(ds.attrs["n_q_heads"]), int(ds.attrs["n_kv_heads"])
    if n_kv <= 0 or n_q % n_kv:
        raise CaptureError(f"n_q_heads ({n_q}) must be a positive multiple of n_kv_heads ({n_kv})")
    expected = ds["q_head"].values // (n_q // n_kv)
    bad = np.flatnonzero(ds["kv_head"].values != expected)
    if bad.size:
        i = int(bad[0])
        raise CaptureError(
            f"{_head_label(ds, i)} has kv_head {int(ds['kv_head'][i])}, but the GQA mapping "
            f"q_head // (n_q/n_kv) = {int(ds['q_head'][i])} // {n_q // n_kv} gives {int(expected[i])} (eq. 4.1)"
        )
    if (ds["q_head"].values >= n_q).any() or (ds["q_head"].values < 0).any():
        raise CaptureError(f"q_head values must lie in [0, n_q_heads={n_q})")
    pairs = np.stack([ds["layer"].values, ds["q_head"].values], 1)
    if np.unique(pairs, axis=0).shape[0] != n_head:
        raise CaptureError("the same (layer, q_head) appears more than once on 'head'")
    if check_finite:
        check_finite_vectors(ds)
    return ds


def check_finite_vectors(ds: xr.Dataset, heads: slice = slice(None)) -> None:
    """Raise :class:`CaptureError` naming the first query or key vector of ``heads`` that holds NaN or Inf."""
    pos = ds["position"].values
    first = heads.start or 0
    for name in ("q", "k"):
        finite = np.isfinite(ds[name].values[heads]).all(axis=-1)  # [head, sample]
        if not finite.all():
            h, s = np.argwhere(~finite)[0]
            raise CaptureError(
                f"{name!r} has NaN or Inf in {int((~finite).sum())} vectors; first at {_head_label(ds, first + int(h))}, "
                f"sample {int(s)} (doc {str(ds['doc'].values[s])!r}, position {int(pos[s])})"
            )


def _json_attrs(attrs: dict) -> str:
    try:
        return json.dumps(attrs, sort_keys=True, allow_nan=True)
    except TypeError as exc:
        raise CaptureError(f"dataset attrs must be JSON-serialisable to round-trip exactly: {exc}") from exc


def _netcdf_attr(value):
    """The nearest native netCDF attribute, for readers that do not know qkplast."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float, str, np.integer, np.floating)):
        return value
    return json.dumps(value)


def save_dataset(ds: xr.Dataset, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write any qkplast dataset to netCDF-4 atomically; refuse to overwrite unless asked."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True (CLI: --overwrite) to replace it")
    if not path.parent.exists():
        raise FileNotFoundError(f"output directory {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise PermissionError(f"output directory {path.parent} is not writable")
    out = ds.copy()
    payload = {"format_version": FORMAT_VERSION, "dataset": _json_attrs(ds.attrs), "vars": {}}
    for name, var in out.variables.items():
        payload["vars"][name] = _json_attrs(var.attrs)
        var.attrs = {k: _netcdf_attr(v) for k, v in var.attrs.items()}
        if var.dtype.kind == "O" or var.dtype.kind == "U":
            var.encoding["dtype"] = str
    out.attrs = {k: _netcdf_attr(v) for k, v in ds.attrs.items()}
    out.attrs[_ATTRS_KEY] = json.dumps(payload)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        out.to_netcdf(tmp, engine="h5netcdf", invalid_netcdf=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def open_dataset(path: str | os.PathLike) -> xr.Dataset:
    """Open a dataset written by :func:`save_dataset`, restoring every attribute exactly."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if path.is_dir():
        raise CaptureError(f"{path} is a directory, not a netCDF file written by qkplast")
    try:
        with xr.open_dataset(path, engine="h5netcdf") as f:
            ds = f.load()
    except (OSError, ValueError, KeyError) as exc:  # h5py and h5netcdf report a corrupt or foreign file so
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CaptureError(
            f"{path} is not a readable netCDF-4 file ({reason}); it may be truncated or not a qkplast output: "
            "write it again (qkplast capture / qkplast analyze)"
        ) from exc
    raw = ds.attrs.get(_ATTRS_KEY)
    if raw is None:
        raise CaptureError(f"{path} was not written by qkplast (no {_ATTRS_KEY!r} attribute)")
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CaptureError(f"{path}: the qkplast attributes are damaged ({exc.msg}); write the file again") from exc
    ds.attrs = json.loads(payload["dataset"])
    for name, var in ds.variables.items():
        var.attrs = json.loads(payload["vars"].get(name, "{}"))
        if var.dtype.kind == "O":
            ds[name] = var.copy(data=var.values.astype(str))
    return ds


def read_attrs(path: str | os.PathLike) -> dict | None:
    """The attributes :func:`open_dataset` restores, read without the data (None for a file that is not a dataset of
    :func:`save_dataset`, unreadable or foreign): what a cache needs to decide whether a file is the one it wants,
    at the cost of its header instead of its hundreds of megabytes."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get(_ATTRS_KEY)
        if raw is None:
            return None
        return json.loads(json.loads(raw.decode() if isinstance(raw, bytes) else raw)["dataset"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_capture(ds: xr.Dataset, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Validate ``ds`` against the capture contract and write it (see module docstring)."""
    validate_capture(ds)
    return save_dataset(ds, path, overwrite=overwrite)


def open_capture(path: str | os.PathLike, *, validate: bool = True) -> xr.Dataset:
    """Open a capture written by :func:`save_capture` and check it against the contract."""
    ds = open_dataset(path)
    return validate_capture(ds) if validate else ds
