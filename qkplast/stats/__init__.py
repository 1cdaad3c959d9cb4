"""Statistics: captures and metrics in, intervals, permutation nulls and verdicts out.

Documents are the unit of every interval on a capture (seeds for anything trained). The inference policy
(:func:`~qkplast.stats.intervals.interval_policy`) picks the interval by the number of units, from the
coverage ``benchmarks/bench_coverage.py`` measures on planted worlds: the bias-corrected jackknife-t, below 8
units with the corrected estimate's own standard error (leave-two-out values).
:func:`bootstrap` (:mod:`~qkplast.stats.bootstrap`) resamples documents, through the reweighted sufficient
statistics of :mod:`~qkplast.stats.reweight`, and reports the policy's interval in ``lo``/``hi`` with the
basic, percentile, BCa and jackknife-t intervals beside it; :func:`document_interval` gives the policy's
interval for any model-level statistic by re-analysing the capture without each document. A statistic with a
range (AP aggregates, masses, shares in [0, 1]; AP_drop, correlations in [-1, 1]) gets its interval on the logit or
Fisher-z scale, mapped back (``bounds=``; :func:`bounded_t_interval` for a mean of unit values), so it never
leaves the range.
:mod:`~qkplast.stats.nulls` holds the permutation nulls and :mod:`~qkplast.stats.decision` the verdict rule
(:func:`verdict`, :func:`holm`, :func:`conjunction`).
"""

from qkplast.stats.bootstrap import bca_interval, bootstrap, document_interval, document_jackknife, document_jackknife2
from qkplast.stats.reweight import reweighted_statistics
from qkplast.stats.intervals import (COVERAGE_TARGET, bounded_t_interval, interval_policy, jackknife_t, policy_interval,
                                     t_interval)
from qkplast.stats.decision import conjunction, holm, null_verdict, verdict

__all__ = ["COVERAGE_TARGET", "bca_interval", "bootstrap", "bounded_t_interval", "conjunction", "document_interval", "document_jackknife", "document_jackknife2",
           "holm", "interval_policy", "jackknife_t", "null_verdict", "policy_interval", "reweighted_statistics",
           "t_interval", "verdict"]
