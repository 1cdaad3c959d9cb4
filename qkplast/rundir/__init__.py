"""The run directory: a run's products on disk (manifest, capture, metrics, bootstrap, cached results) and the
study file that names many runs; every product reused when its key matches, recomputed when its code changed.

:mod:`~qkplast.rundir.products` reads and writes one run directory (:func:`load_run` is what a notebook
calls; :func:`cached` is the one cache every product goes through); :mod:`~qkplast.rundir.study_file`
parses a study file into run specs without submitting anything.
"""

from qkplast.rundir.study_file import STAGES, RunSpec, Study, StudyError, load_study, parse_study

__all__ = ["STAGES", "Run", "RunError", "RunSpec", "Study", "StudyError", "cached", "chapter_run", "checkpoint_dir",
           "checkpoint_metrics", "load_or_analyze", "load_or_bootstrap", "load_or_capture", "load_run", "load_study",
           "open_metrics", "parse_study", "product_store", "run_settings"]


def __getattr__(name: str):
    """The names of :mod:`~qkplast.rundir.products`, imported on first use (PEP 562): it imports xarray, which
    the command line's parsers and ``qkplast study --status`` (reading study files and JSON) never need."""
    if name in __all__:
        from qkplast.rundir import products

        return getattr(products, name)
    raise AttributeError(f"module 'qkplast.rundir' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
