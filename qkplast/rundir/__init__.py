"""The run directory: a run's products on disk (manifest, capture, metrics, bootstrap, cached results) and the
study file that names many runs; every product reused when its key matches, recomputed when its code changed.

:mod:`~qkplast.rundir.products` reads and writes one run directory (:func:`load_run` is what a notebook
calls; :func:`cached` is the one cache every product goes through); :mod:`~qkplast.rundir.derived` keeps the
other products a chapter computes from the capture (permutation nulls, analyses with other options, bounds);
:mod:`~qkplast.rundir.study_file` parses a study file into run specs without submitting anything.
"""

from qkplast.rundir.study_file import STAGES, RunSpec, Study, StudyError, load_study, parse_study

#: Names of the submodules that import xarray, by the submodule that defines them.
_LAZY = {"products": ["Run", "RunError", "cached", "chapter_run", "checkpoint_dir", "checkpoint_metrics",
                      "load_or_analyze", "load_or_bootstrap", "load_or_capture", "load_run", "open_metrics",
                      "product_store", "run_settings"],
         "derived": ["load_or_basis_dependence", "load_or_null", "load_or_pair_bounds", "load_or_plasticity",
                     "load_or_pooling_table", "load_or_slope_nulls"]}

__all__ = sorted(["STAGES", "RunSpec", "Study", "StudyError", "load_study", "parse_study",
                  *(name for names in _LAZY.values() for name in names)])


def __getattr__(name: str):
    """The names of :mod:`~qkplast.rundir.products` and :mod:`~qkplast.rundir.derived`, imported on first use
    (PEP 562): they import xarray, which the command line's parsers and ``qkplast study --status`` (reading study
    files and JSON) never need."""
    if name in _LAZY["products"]:
        from qkplast.rundir import products

        return getattr(products, name)
    if name in _LAZY["derived"]:
        from qkplast.rundir import derived

        return getattr(derived, name)
    raise AttributeError(f"module 'qkplast.rundir' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
