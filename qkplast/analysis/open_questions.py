"""The per-head metrics of the chapter "Beyond the thesis: open questions", added to :func:`qkplast.analyze`."""

from __future__ import annotations

import xarray as xr

from qkplast.analysis.decompose import decompose_drop
from qkplast.analysis.listwise import listwise
from qkplast.options import AnalysisOptions


def open_questions(capture: xr.Dataset, options: AnalysisOptions, metrics: xr.Dataset) -> xr.Dataset:
    """Listwise plasticity (:mod:`qkplast.analysis.listwise`) and the AP_drop decomposition (:mod:`qkplast.analysis.decompose`).

    ``metrics`` must hold ``ap_drop`` (the plasticity part of ``analyze``): the
    decomposition's three parts add up to exactly that total.
    """
    parts = [listwise(capture, options), decompose_drop(capture, options, ap_drop=metrics["ap_drop"].values)]
    return xr.merge(parts, compat="no_conflicts", combine_attrs="drop")
