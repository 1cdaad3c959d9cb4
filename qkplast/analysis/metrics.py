"""One call from a capture to every per-head metric of sections 4.2-4.4."""

from __future__ import annotations

import torch
import xarray as xr

from qkplast._version import __version__
from qkplast.capture_format import check_finite_vectors, validate_capture
from qkplast.analysis.extra_metrics import (concat, decomposition_hook, listwise_chunk, open_plan,
                                             open_questions_dataset)
from qkplast.options import AnalysisOptions
from qkplast.analysis.vectors import analysis_vectors
from qkplast.tensors import LISTWISE_CPU_MB, SCRATCH_CPU_MB, auto_chunk, head_vectors, map_head_chunks, resolve_device
from qkplast.analysis.moments import cloud_moments
from qkplast.analysis.pca import pca_dataset, pca_from_moments
from qkplast.analysis.pairs import pair_plan
from qkplast.analysis.plasticity import bytes_per_head, plasticity_dataset, plasticity_kernel, rotated_clouds
from qkplast.analysis.rotation import rotation_dataset, rotation_from_moments
# the version of analyze()'s output: bump it in qkplast.analysis.schema, which readers of finished runs import without torch
from qkplast.analysis.schema import SCHEMA_VERSION

HEAD_COORDS = ("layer", "q_head", "kv_head", "rope")


def thesis_metrics(capture: xr.Dataset, opt: AnalysisOptions) -> list[xr.Dataset]:
    """The Datasets of :func:`~qkplast.analysis.pca.pca`, :func:`~qkplast.analysis.rotation.rotation` and
    :func:`~qkplast.analysis.plasticity.plasticity`, and with ``opt.open_questions`` the listwise plasticity and
    the AP_drop decomposition, from one pass over the heads.

    Each chunk of heads is read, converted to float64 and centred once
    (:func:`qkplast.analysis.moments.cloud_moments`); the three analyses share those
    moments, the plasticity's Householder basis, query model and key-pair differences serve the
    open-questions metrics as well (:mod:`qkplast.analysis.extra_metrics`), and the chunks run on every
    core (:func:`qkplast.tensors.map_head_chunks`).
    """
    dev = resolve_device(opt.device)
    lay = pair_plan(capture, opt, dev, warn=True)
    extra = open_plan(capture, lay, opt, dev) if opt.open_questions else None

    def one_chunk(sl: slice):
        m = cloud_moments(*head_vectors(capture, sl, dev), lay.t)
        if not bool(torch.isfinite(m.mean_q).all() & torch.isfinite(m.mean_k).all()):
            check_finite_vectors(capture, sl)  # a NaN or Inf anywhere in a head reaches its mean
        rot = rotated_clouds(m, lay, opt)
        hook = decomposition_hook(rot, lay, extra) if extra else None
        listwise = listwise_chunk(rot, extra, opt) if extra else None
        return pca_from_moments(m), rotation_from_moments(m), plasticity_kernel(m, lay, opt, rot, hook), listwise

    # the largest temporaries are per-thread scratch buffers, so chunks can be larger than the 16 MB default
    budget = LISTWISE_CPU_MB if extra else SCRATCH_CPU_MB
    chunk = opt.head_chunk or auto_chunk(bytes_per_head(lay, capture.sizes["dim"], opt, True, dev), dev, budget)
    pca_parts, rotation_parts, plasticity_parts, listwise_parts = zip(
        *map_head_chunks(one_chunk, capture.sizes["head"], chunk, dev))
    plast = plasticity_dataset(list(plasticity_parts), lay, int(capture.attrs["seq_len"]), opt)
    out = [pca_dataset(list(pca_parts), opt.taxonomy_low, opt.taxonomy_high), rotation_dataset(list(rotation_parts)),
           plast]
    if extra:
        out.append(open_questions_dataset(plast, concat(plasticity_parts, "extra"), list(listwise_parts), extra,
                                          capture, opt))
    return out


def analyze(capture: xr.Dataset, options: AnalysisOptions | None = None, **overrides) -> xr.Dataset:
    """PCA, planar rotation and attention plasticity of every captured head.

    Parameters
    ----------
    capture : xarray.Dataset
        A capture (see :mod:`qkplast.capture_format`); validated first, so NaN/Inf vectors,
        wrong dims or a broken GQA mapping are errors.
    options : AnalysisOptions, optional
        Base options; keyword ``overrides`` replace single fields
        (``analyze(cap, covariance="full")``). Unknown names raise ``TypeError``.

    Returns
    -------
    xarray.Dataset
        Per head: ``r_q_pc``, ``r_k_pc``, ``explained_variance_ratio`` (head, pc),
        ``taxonomy``; ``r_q_a``, ``r_k_a``, ``alpha_q``, ``alpha_k``, ``mu_q_a``,
        ``bias_strength`` (eq. 4.6), ``key_position_slope`` (``mu_Q^T beta_K``, the
        full slope of the mean score over key position) and ``key_position_ratio``
        (its ratio to ``bias_strength``), ``plane_variance_fraction``,
        ``separation_strength``, the axes ``axis_a``/``axis_b``; ``ap``, ``ap_mc``
        and ``ap_mc_se`` (its Monte Carlo standard error over the pair draw)
        (head, query_bucket), ``ap_overall``, ``ap_first20``, ``ap_last20``,
        ``ap_drop`` (and ``_mc`` twins), ``ap_context`` and the 2D map ``ap_map``;
        beyond the thesis: ``ap_set``/``ap_set_mc`` (head, query_bucket,
        set_size), ``nearest_mass_position``, ``nearest_mass`` (and per document, ``..._doc``), and
        ``ap_drop_baseline`` + ``ap_drop_bias`` + ``ap_drop_content`` + ``ap_drop_interaction`` =
        ``ap_drop`` with ``ap_counterfactual`` (see :mod:`qkplast.analysis.decompose`), unless
        ``open_questions=False``.
        The head coords of the capture are kept; attrs hold the options, the
        capture's attrs and the qkplast version.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    # NaN and Inf are found chunk by chunk, in parallel, through the clouds' means (thesis_metrics)
    validate_capture(capture, check_finite=False)
    capture = analysis_vectors(capture, opt)  # head_dims, query_scale (identity under the defaults)
    out = xr.merge(thesis_metrics(capture, opt), compat="no_conflicts", combine_attrs="drop")
    out = out.assign_coords({name: ("head", capture[name].values) for name in HEAD_COORDS})
    out.attrs = {"qkplast_version": __version__, "schema_version": SCHEMA_VERSION, "options": opt.to_dict(),
                 "capture": dict(capture.attrs)}
    return out
