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

from qkplast.stats.bootstrap import (bca_interval, bootstrap, document_interval, document_jackknife, document_jackknife2,
                                     head_bootstrap)
from qkplast.stats.reweight import reweighted_statistics
from qkplast.stats.intervals import (COVERAGE_TARGET, bounded_t_interval, interval_policy, jackknife_t, policy_interval,
                                     t_interval)
from qkplast.stats.decision import conjunction, coverage_verdict, holm, holm_verdicts, null_verdict, rejects, verdict
from qkplast.stats.intervention_readings import effect_table, functional_check, load_readings, readings
from qkplast.stats.condition_readings import condition_table, describe_conditions, mechanism_reading, read_conditions

__all__ = ["COVERAGE_TARGET", "bca_interval", "bootstrap", "bounded_t_interval", "condition_table", "conjunction",
           "coverage_verdict", "describe_conditions", "document_interval", "document_jackknife", "document_jackknife2",
           "effect_table", "functional_check", "head_bootstrap", "holm", "holm_verdicts", "interval_policy",
           "jackknife_t", "load_readings", "mechanism_reading", "null_verdict", "policy_interval", "read_conditions",
           "readings", "rejects", "reweighted_statistics", "t_interval", "verdict"]
