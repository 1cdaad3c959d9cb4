"""What the analyses read of a capture: the vectors as captured, or with a family's peculiarity taken out.

Two families store something beside their vectors that changes what the
vectors mean (see :mod:`qkplast.capture_format`, optional coordinates):

* GPT-NeoX (Pythia) turns only the first quarter of each head's dimensions
  (``rotary`` on ``dim``); the other dimensions carry content and whatever
  position the residual stream has inferred, but no rotary position.
* Ministral-3 multiplies its queries after RoPE by a factor that grows with
  the position (``query_scale`` on ``sample``): 1 up to the original window,
  ``1 + beta log(1 + floor(t / original))`` beyond it.

:func:`analysis_vectors` applies :attr:`qkplast.options.AnalysisOptions.head_dims`
and :attr:`~qkplast.options.AnalysisOptions.query_scale`. Every analysis that
takes :class:`~qkplast.options.AnalysisOptions` calls it first; with the
defaults (``"all"``, ``"as_captured"``) it returns the capture itself, so
results for the thesis's families do not change. It is idempotent: a view
passed to another analysis is not transformed twice.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from qkplast.options import AnalysisOptions, OptionsError

__all__ = ["analysis_vectors", "rotary_mask"]


def rotary_mask(capture: xr.Dataset) -> np.ndarray:
    """``[dim]`` booleans: dimensions turned by the rotary embedding (all, for a capture without ``rotary``)."""
    if "rotary" in capture.coords:
        return np.asarray(capture["rotary"].values, dtype=bool)
    return np.ones(capture.sizes["dim"], dtype=bool)


def _queries_unscaled(capture: xr.Dataset) -> xr.Dataset:
    """Each query divided by its position's factor; the factor set to 1 (so a second call changes nothing)."""
    scale = np.asarray(capture["query_scale"].values, dtype=np.float64)  # [sample]
    if np.all(scale == 1.0):
        return capture
    q = capture["q"].values / scale[None, :, None]  # [head, sample, dim], float64 for the division
    out = capture.assign(q=(capture["q"].dims, q.astype(capture["q"].dtype)))
    return out.assign_coords(query_scale=("sample", np.ones_like(scale)))


def _selected_dims(capture: xr.Dataset, head_dims: str) -> xr.Dataset:
    mask = rotary_mask(capture)
    keep = mask if head_dims == "rotary" else ~mask
    if not keep.any():
        raise OptionsError(
            f"option head_dims={head_dims!r} leaves no dimension: "
            + ("no dimension of this capture rotates" if head_dims == "rotary" else
               "every dimension of this capture rotates (only GPT-NeoX-style captures have non-rotary ones)")
            + "; use head_dims='all'"
        )
    return capture if keep.all() else capture.isel(dim=np.flatnonzero(keep))


def analysis_vectors(capture: xr.Dataset, options: AnalysisOptions) -> xr.Dataset:
    """The capture the analyses read under ``options.query_scale`` and ``options.head_dims``.

    Parameters
    ----------
    capture : xarray.Dataset
        A capture (:mod:`qkplast.capture_format`).
    options : AnalysisOptions
        ``query_scale="divided_out"`` divides each query by the capture's
        ``query_scale`` factor at its position (keys carry none); then
        ``head_dims`` keeps all dimensions, the rotary ones or the others
        (``rotary`` coordinate; a capture without it rotates every dimension).

    Returns
    -------
    xarray.Dataset
        ``capture`` itself when nothing changes (the defaults, or a family
        without the coordinate), else a new dataset with fewer ``dim`` or
        rescaled ``q``; the other variables and coordinates are kept.

    Raises
    ------
    OptionsError
        ``head_dims`` would leave no dimension.
    """
    out = capture
    if options.query_scale == "divided_out" and "query_scale" in capture.coords:
        out = _queries_unscaled(out)
    if options.head_dims != "all":
        out = _selected_dims(out, options.head_dims)
    return out
