"""The per-head metrics of the chapter "Beyond the thesis: open questions", computed in the thesis's own pass.

:func:`qkplast.analyze` reads each chunk of heads once (:func:`qkplast.analysis.metrics.thesis_metrics`):
the moments, the Householder basis, the query model and the key pairs' differences of the thesis's
plasticity are what the listwise plasticity (:mod:`qkplast.analysis.listwise`) and the AP_drop
decomposition (:mod:`qkplast.analysis.decompose`) need as well, so they run on them inside the same pass
instead of recomputing them. This module holds the glue: the per-capture layouts and the datasets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import to_numpy
from qkplast.analysis.decompose import Counterfactuals, counterfactuals, decomposition_dataset, usable_counts
from qkplast.analysis.listwise import ListwiseChunk, SetPlan, listwise_dataset, listwise_kernel, set_plan
from qkplast.analysis.plasticity import Rotated
from qkplast.options import AnalysisOptions


@dataclass
class OpenPlan:
    """What the open-questions metrics of every head share: the key sets and the context-average weights."""

    sets: SetPlan
    usable: torch.Tensor  # [bucket]


def open_plan(capture: xr.Dataset, lay, opt: AnalysisOptions, dev: torch.device) -> OpenPlan:
    """The shared layouts, drawn once per capture (the sets with the analysis seed, as :func:`listwise` draws them)."""
    return OpenPlan(set_plan(capture, lay, opt, dev), usable_counts(lay, opt, dev))


def decomposition_hook(rot: Rotated, lay, layout: OpenPlan) -> Counterfactuals:
    """The block hook of :func:`qkplast.analysis.plasticity.pair_kernel` that evaluates the counterfactual models."""
    return counterfactuals(rot.model, rot.key_slope, lay, layout.usable)


def listwise_chunk(rot: Rotated, layout: OpenPlan, opt: AnalysisOptions) -> ListwiseChunk:
    return listwise_kernel(rot, layout.sets, opt)


def open_questions_dataset(plasticity: xr.Dataset, variants: np.ndarray, listwise_chunks: list, layout: OpenPlan,
                           capture: xr.Dataset, opt: AnalysisOptions) -> xr.Dataset:
    """Listwise plasticity and the AP_drop decomposition from the chunks of the shared pass.

    ``plasticity`` is the thesis's plasticity Dataset (its ``ap``, ``ap_mc`` and ``ap_drop``: the set size 2
    and the decomposition's total); ``variants`` ``[head, bucket, 3]`` the counterfactual profiles.
    """
    profiles = np.concatenate([plasticity["ap"].values[None], np.moveaxis(variants, -1, 0)])  # [variant, head, bucket]
    parts = decomposition_dataset(profiles, plasticity.tau.values, plasticity.query_bucket.values,
                                  int(capture.attrs["seq_len"]), opt, plasticity["ap_drop"].values)
    lw = listwise_dataset(listwise_chunks, layout.sets, plasticity.query_bucket.values, np.unique(capture["doc"].values),
                          plasticity["ap"].values, plasticity["ap_mc"].values, opt.n_model_queries)
    return xr.merge([lw, parts], compat="no_conflicts", combine_attrs="drop")


def concat(chunks, name: str) -> np.ndarray:
    """One attribute of consecutive chunks, concatenated over heads."""
    return to_numpy(torch.cat([getattr(c, name) for c in chunks]))
