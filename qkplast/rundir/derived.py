"""Products of a run's capture that chapters read beside its metrics and bootstrap, kept in the run directory.

Each ``load_or_*`` returns what the function it wraps returns, computed once per setting and code and read back
after that (:func:`~qkplast.rundir.products.cached`). The key holds the schema version of this module's layout
(:data:`SCHEMA_VERSION`), every setting that can change the numbers (the permutations' seed and chunking, the
analysis options, the pairs per bucket...) and :func:`qkplast.provenance.product_provenance` of the qkplast
subpackages the product's code lives in and imports from, the libraries and the machine: a second execution reads
the product back, and any change of that code, or a move to another machine, computes it again.

The chapter on corrections (notebook 07) reads:

* :func:`load_or_null`: the permutation nulls of :mod:`qkplast.stats.nulls` (diagonal, bucket shuffle,
  independence), one file each;
* :func:`load_or_slope_nulls`: both position-shuffle nulls of :mod:`qkplast.stats.shuffles` (items 5 and 9), from
  one pass over the shared permutations;
* :func:`load_or_plasticity`: :func:`qkplast.analysis.plasticity.plasticity` with other options than the run's;
* :func:`load_or_pair_bounds`: Theorem 4.4's constants per head
  (:func:`qkplast.theory.checks.aggregate_bound_for_heads`) and the ``|delta_1|`` of every valid pair, from
  :func:`qkplast.analysis.plasticity.pair_statistics`;
* :func:`load_or_basis_dependence`: :func:`qkplast.theory.checks.basis_dependence`;
* :func:`load_or_pooling_table`: :func:`qkplast.analysis.pooling.pooling_table` from the cached
  :func:`qkplast.analysis.pooling.within_document_ap`.

A product that is a table travels as a Dataset (:func:`frame_dataset`) and comes back as the same
``pandas.DataFrame`` (:func:`dataset_frame`: columns, their order and dtypes, the index and its name).
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import xarray as xr

from qkplast.options import AnalysisOptions
from qkplast.provenance import product_provenance
from qkplast.rundir.products import cached

__all__ = ["NULLS", "SCHEMA_VERSION", "dataset_frame", "frame_dataset", "load_or_basis_dependence", "load_or_null",
           "load_or_pair_bounds", "load_or_plasticity", "load_or_pooling_table", "load_or_slope_nulls"]

#: Version of the layout of this module's products (bump when a product's variables or attrs change meaning).
SCHEMA_VERSION = 1

#: The permutation nulls :func:`load_or_null` keeps, by the name it takes.
NULLS = ("diagonal", "bucket_shuffle", "independence")

#: The qkplast code of the products below: the subpackages they live in and every module they import from (the
#: options, the device and float64 helpers) and this module, which lays them out; the theory's products add "theory".
_CODE = ("analysis", "stats", "tensors.py", "options.py", "rundir/derived.py")


def _provenance(*extra: str) -> dict:
    from qkplast.tensors import resolve_device

    return product_provenance(*_CODE, *extra, device=str(resolve_device("auto")))


# --------------------------------------------------------------------------- tables as datasets


def frame_dataset(frame: pd.DataFrame, prefix: str = "") -> xr.Dataset:
    """A ``DataFrame`` as a Dataset that :func:`dataset_frame` turns back into the same frame.

    Each column becomes a variable ``prefix + str(i)`` along a dim ``prefix + "row"``; the column names and their
    order, the index's values, name and kind travel in attrs and coords.
    """
    row = prefix + "row"
    data = {f"{prefix}{i}": (row, frame[c].to_numpy()) for i, c in enumerate(frame.columns)}
    index = frame.index
    return xr.Dataset(data, coords={f"{prefix}index": (row, index.to_numpy())},
                      attrs={f"{prefix}columns": [str(c) for c in frame.columns],
                             f"{prefix}index_name": index.name, f"{prefix}index_kind": index.dtype.kind})


def dataset_frame(ds: xr.Dataset, prefix: str = "") -> pd.DataFrame:
    """The ``DataFrame`` :func:`frame_dataset` stored under ``prefix``."""
    columns = ds.attrs[f"{prefix}columns"]
    index = ds[f"{prefix}index"].values
    if ds.attrs[f"{prefix}index_kind"] in "OU":  # text labels: object strings, as pandas builds them
        index = index.astype(object)
    frame = pd.DataFrame({c: ds[f"{prefix}{i}"].values for i, c in enumerate(columns)},
                         index=pd.Index(index, name=ds.attrs[f"{prefix}index_name"]))
    return frame


# --------------------------------------------------------------------------- permutation nulls


def _null_function(null: str):
    from qkplast.stats import nulls

    if null not in NULLS:
        raise ValueError(f"null must be one of {NULLS}, got {null!r}")
    return getattr(nulls, f"{null}_null")


def null_key(null: str, n_perm: int, seed: int, options: AnalysisOptions | None, **settings) -> dict:
    """The cache key of :func:`load_or_null`: the null, every argument of its function (defaults filled in: the
    pairs per bucket and the permutations per chunk decide the draws), the analysis options and the provenance."""
    fn = _null_function(null)
    bound = inspect.signature(fn).bind(None, n_perm=n_perm, seed=seed, options=None, **settings)
    bound.apply_defaults()
    args = {k: v for k, v in bound.arguments.items() if k not in ("capture", "options")}
    return {"schema": SCHEMA_VERSION, "product": f"{null}_null", "arguments": args,
            "options": AnalysisOptions.from_kwargs(options).result_key(), "provenance": _provenance()}


def load_or_null(run_dir, capture: xr.Dataset, null: str, n_perm: int = 1000, seed: int = 0,
                 options: AnalysisOptions | None = None, **settings) -> xr.Dataset:
    """A permutation null of :mod:`qkplast.stats.nulls` for the run's capture: reused, else computed and saved.

    Parameters
    ----------
    run_dir : path
        The run directory (``RUN/null-<null>.nc``).
    capture : xarray.Dataset
        The run's capture.
    null : {"diagonal", "bucket_shuffle", "independence"}
        :func:`~qkplast.stats.nulls.diagonal_null`, :func:`~qkplast.stats.nulls.bucket_shuffle_null` or
        :func:`~qkplast.stats.nulls.independence_null`.
    n_perm, seed, options, **settings
        Passed to the function (``pairs_per_bucket``, ``perm_chunk``).

    Returns
    -------
    xarray.Dataset
        The function's result (with the ``cache_key`` attr).
    """
    fn = _null_function(null)
    key = null_key(null, n_perm, seed, options, **settings)
    return cached(run_dir, f"null-{null.replace('_', '-')}", key,
                  lambda: fn(capture, n_perm=n_perm, seed=seed, options=options, **settings))


def slope_nulls_dataset(result: dict) -> xr.Dataset:
    """:func:`qkplast.stats.shuffles.slope_nulls`'s dict as a Dataset (``<name>_observed``, ``<name>_null``)."""
    data = {}
    for name, r in result.items():
        data[f"{name}_observed"] = ((), float(r["observed"]))
        data[f"{name}_null"] = ("permutation", np.asarray(r["null"], np.float64))
    return xr.Dataset(data, attrs={"statistics": list(result)})


def load_or_slope_nulls(run_dir, capture: xr.Dataset, n_perm: int = 1000, seed: int = 0, chunk: int = 50) -> dict:
    """Both position-shuffle nulls of the corrections page (:func:`qkplast.stats.shuffles.slope_nulls`): reused,
    else computed in one pass and saved (``RUN/null-slopes.nc``).

    Returns
    -------
    dict
        ``{"key_slope_sign": {"observed", "null"}, "off_axis": {"observed", "null"}}``, as
        :func:`qkplast.stats.shuffles.key_slope_sign_null` and :func:`qkplast.stats.nulls.off_axis_null` give them.
    """
    from qkplast.stats.shuffles import SLOPE_STATISTICS, slope_nulls

    key = {"schema": SCHEMA_VERSION, "product": "slope_nulls", "statistics": sorted(SLOPE_STATISTICS),
           "n_perm": n_perm, "seed": seed, "chunk": chunk, "provenance": _provenance()}
    ds = cached(run_dir, "null-slopes", key,
                lambda: slope_nulls_dataset(slope_nulls(capture, n_perm=n_perm, seed=seed, chunk=chunk)))
    return {name: {"observed": float(ds[f"{name}_observed"]), "null": ds[f"{name}_null"].values}
            for name in ds.attrs["statistics"]}


# --------------------------------------------------------------------------- analyses with other options


def load_or_plasticity(run_dir, capture: xr.Dataset, options: AnalysisOptions | None = None, *,
                       monte_carlo: bool = True, **overrides) -> xr.Dataset:
    """:func:`qkplast.analysis.plasticity.plasticity` of the run's capture with ``options`` and ``overrides``:
    reused, else computed and saved (``RUN/plasticity.nc``, other options ``RUN/plasticity-<hash>.nc``).

    ``monte_carlo=False``: the closed-form variables alone (a fifth of the work; the same values). Its
    :class:`~qkplast.analysis.pairs.PlasticityWarning` are raised when it is computed, not when it is read.
    """
    from qkplast.analysis.plasticity import plasticity

    opt = AnalysisOptions.from_kwargs(options, **overrides)
    key = {"schema": SCHEMA_VERSION, "product": "plasticity", "options": opt.result_key(), "monte_carlo": monte_carlo,
           "provenance": _provenance()}
    return cached(run_dir, "plasticity", key, lambda: plasticity(capture, opt, monte_carlo=monte_carlo))


def pair_bounds(capture: xr.Dataset, metrics: xr.Dataset | None, options: AnalysisOptions | None = None,
                route: str = "sharp") -> xr.Dataset:
    """Theorem 4.4's constants per head and ``|delta_1|`` of every valid (head, bucket, pair), as one Dataset.

    :func:`qkplast.analysis.plasticity.pair_statistics` of all heads, then
    :func:`qkplast.theory.checks.aggregate_bound_for_heads` (``metrics``: the measured plasticity of the last bucket);
    the table under ``bounds_`` (:func:`frame_dataset`), ``abs_delta1`` flat in the order of the valid terms.
    """
    from qkplast.analysis.plasticity import pair_statistics
    from qkplast.theory.checks import aggregate_bound_for_heads

    opt = AnalysisOptions.from_kwargs(options)
    # the options' variance alone: the bound reads it, and the other full-covariance forms cost most of the work
    stats = pair_statistics(capture, options=opt, variances=({"diagonal": "v_diag", "full": "v_full",
                                                              "joint": "v_joint"}[opt.covariance],))
    d1 = np.abs(stats.delta1.values[stats.valid.values])
    ds = frame_dataset(aggregate_bound_for_heads(stats, metrics, route=route), "bounds_")
    ds["abs_delta1"] = ("term", d1)
    return ds


def load_or_pair_bounds(run_dir, capture: xr.Dataset, metrics: xr.Dataset | None = None,
                        options: AnalysisOptions | None = None, route: str = "sharp"):
    """:func:`pair_bounds`, reused or computed and saved (``RUN/pair-bounds.nc``).

    ``metrics`` should be a product of this run (:func:`~qkplast.rundir.products.load_or_analyze`): its cache key
    enters this one. Returns ``(abs_delta1, bounds)``: the ``|delta_1|`` of every valid term (numpy) and the table of
    :func:`qkplast.theory.checks.aggregate_bound_for_heads`.
    """
    key = {"schema": SCHEMA_VERSION, "product": "pair_bounds", "options": AnalysisOptions.from_kwargs(options).result_key(),
           "route": route, "metrics": None if metrics is None else metrics.attrs.get("cache_key", "given"),
           "provenance": _provenance("theory")}
    ds = cached(run_dir, "pair-bounds", key, lambda: pair_bounds(capture, metrics, options, route))
    return ds["abs_delta1"].values, dataset_frame(ds, "bounds_")


def load_or_basis_dependence(run_dir, capture: xr.Dataset, seed: int = 0, heads=None, **options) -> pd.DataFrame:
    """:func:`qkplast.theory.checks.basis_dependence`: reused, else computed and saved (``RUN/basis-dependence.nc``).

    ``heads`` (a slice or positions along ``head``) and ``options`` as the function takes them.
    """
    from qkplast.theory.checks import basis_dependence

    chosen = np.arange(capture.sizes["head"])[heads] if heads is not None else None
    key = {"schema": SCHEMA_VERSION, "product": "basis_dependence", "seed": seed,
           "heads": None if chosen is None else np.atleast_1d(chosen).tolist(), "options": options,
           "provenance": _provenance("theory")}
    ds = cached(run_dir, "basis-dependence", key,
                lambda: frame_dataset(basis_dependence(capture, seed=seed, heads=heads, **options)))
    return dataset_frame(ds)


def load_or_pooling_table(run_dir, capture: xr.Dataset, names=("ap_overall", "ap_first20", "ap_last20", "ap_drop"),
                          options: AnalysisOptions | None = None, **overrides) -> tuple[pd.DataFrame, str]:
    """:func:`qkplast.analysis.pooling.pooling_table` from the cached
    :func:`qkplast.analysis.pooling.within_document_ap` (``RUN/within-document.nc``)."""
    from qkplast.analysis.pooling import pooling_summary, within_document_ap

    opt = AnalysisOptions.from_kwargs(options, **overrides)
    key = {"schema": SCHEMA_VERSION, "product": "within_document_ap", "options": opt.result_key(),
           "provenance": _provenance()}
    return pooling_summary(cached(run_dir, "within-document", key, lambda: within_document_ap(capture, opt)), names)
