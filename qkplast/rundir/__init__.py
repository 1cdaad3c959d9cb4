"""The run directory: a run's products on disk (manifest, capture, metrics, bootstrap, cached results) and the
study file that names many runs; every product reused when its key matches, recomputed when its code changed.

:mod:`~qkplast.rundir.products` reads and writes one run directory (:func:`load_run` is what a notebook
calls; :func:`cached` is the one cache every product goes through, keyed by its settings, the schema of its code
and :func:`qkplast.provenance.product_provenance`); :mod:`~qkplast.rundir.derived` keeps the other products a
chapter computes from the capture (permutation nulls, analyses with other options, bounds) through ``load_or_*``
wrappers; the layers below this one, which cannot import it, keep the replicates inside a computation (a
jackknife's left-out values, a reseeded null) through the ``store`` a notebook passes them,
:func:`product_store` (:func:`cached` bound to the run directory). :mod:`~qkplast.rundir.study_file` parses a
study file into run specs without submitting anything.
"""

from qkplast.lazy import lazy_names
from qkplast.rundir.study_file import STAGES, RunSpec, Study, StudyError, load_study, parse_study

#: Names of the submodules that import xarray, by the submodule that defines them.
_LAZY = {"products": ["Run", "RunError", "cached", "chapter_run", "checkpoint_dir", "checkpoint_metrics",
                      "load_or_analyze", "load_or_bootstrap", "load_or_capture", "load_run", "open_metrics",
                      "product_store", "run_settings"],
         "derived": ["load_or_basis_dependence", "load_or_null", "load_or_pair_bounds", "load_or_plasticity",
                     "load_or_pooling_table", "load_or_slope_nulls"]}

__all__ = sorted(["STAGES", "RunSpec", "Study", "StudyError", "load_study", "parse_study",
                  *(name for names in _LAZY.values() for name in names)])


#: The names above load on first use (PEP 562): their modules import xarray, which the command line's parsers and
#: ``qkplast study --status`` (reading study files and JSON) never need.
__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__)
