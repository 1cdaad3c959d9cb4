"""Statistics: captures and metrics in, intervals, permutation nulls and verdicts out.

Documents are the unit of every interval on a capture (seeds for anything trained). The inference policy
(:func:`~qkplast.stats.intervals.interval_policy`) picks the interval by the number of units, from the
coverage ``benchmarks/bench_coverage.py`` measures on planted worlds: the bias-corrected jackknife-t, below 8
units with the corrected estimate's own standard error (leave-two-out values); for AP_drop from 8 units on the plain
jackknife-t, which the table shows covering where the corrected one falls short.
:func:`bootstrap` (:mod:`~qkplast.stats.bootstrap`) resamples documents, through the reweighted sufficient
statistics of :mod:`~qkplast.stats.reweight`, and reports the policy's interval in ``lo``/``hi`` with the
basic, percentile, BCa and jackknife-t intervals beside it; :func:`document_interval` gives the policy's
interval for any model-level statistic by re-analysing the capture without each document. A statistic with a
range (AP aggregates, masses, shares in [0, 1]; AP_drop, correlations in [-1, 1]) gets its interval on the logit or
Fisher-z scale, mapped back (``bounds=``; :func:`bounded_t_interval` for a mean of unit values), so it never
leaves the range.
:mod:`~qkplast.stats.nulls` holds the permutation nulls, :mod:`~qkplast.stats.shuffles` the position-shuffle nulls
of the rotation model, and :mod:`~qkplast.stats.decision` the verdict rule (:func:`verdict`, :func:`holm`,
:func:`conjunction`; a page's readings decided together: :func:`holm_verdicts`). :func:`head_bootstrap` resamples
heads, for tables that read only metrics. The chapters' readings live here too: chapter 12's interventions
(:mod:`~qkplast.stats.intervention_readings`: the registration, the functional check, the readings against their
null sets) and chapter 13's conditions (:mod:`~qkplast.stats.condition_readings`); the power calculation is
:mod:`~qkplast.stats.power`.
"""

from qkplast.lazy import lazy_names

import sys as _sys
import types as _types

__all__ = ["COVERAGE_TARGET", "bca_interval", "bootstrap", "bounded_t_interval", "condition_table", "conjunction",
           "coverage_verdict", "describe_conditions", "document_interval", "document_jackknife", "document_jackknife2",
           "effect_table", "functional_check", "head_bootstrap", "holm", "holm_verdicts", "interval_policy",
           "jackknife_t", "load_readings", "mechanism_reading", "null_verdict", "policy_interval", "read_conditions",
           "readings", "rejects", "reweighted_statistics", "t_interval", "verdict"]


#: Where each public name lives. The names load on first use (PEP 562): these modules import torch or scipy, which
#: a reader of a finished run (the bootstrap's cache key and the interval methods' words,
#: :mod:`~qkplast.stats.schema`) never needs.
_HOMES = {
    "bootstrap": ("bca_interval", "bootstrap", "document_interval", "document_jackknife", "document_jackknife2",
                  "head_bootstrap"),
    "reweight": ("reweighted_statistics",),
    "intervals": ("COVERAGE_TARGET", "bounded_t_interval", "interval_policy", "jackknife_t", "policy_interval",
                  "t_interval"),
    "decision": ("conjunction", "coverage_verdict", "holm", "holm_verdicts", "null_verdict", "rejects", "verdict"),
    "intervention_readings": ("effect_table", "functional_check", "load_readings", "readings"),
    "condition_readings": ("condition_table", "describe_conditions", "mechanism_reading", "read_conditions"),
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)


class _Package(_types.ModuleType):
    """This package, whose ``bootstrap`` is the function of :mod:`~qkplast.stats.bootstrap`, not that module.

    The import system binds a submodule to its package's attribute of the same name when it first loads it (here
    by whichever import comes first, :func:`__getattr__`'s or another module's). This file once imported the
    function after the module, which rebound the name; loading on first use keeps it so here instead.
    """

    def __setattr__(self, name, value):
        if name == "bootstrap" and isinstance(value, _types.ModuleType):
            value = value.bootstrap
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
