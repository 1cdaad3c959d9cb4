"""What readers of the stats layer's finished products need from its code without running it: the version of
:func:`~qkplast.stats.bootstrap.bootstrap`'s output and which computation makes it (:func:`supports`), both in
the key of a run directory's ``bootstrap.nc``, and the words pages print for each interval method.

Imports no numerics: a chapter that reads a finished run's bootstrap looks it up and prints its intervals without
importing torch or scipy (:mod:`~qkplast.stats.bootstrap` and :mod:`~qkplast.stats.reweight`, which compute,
re-export these names).
"""

from __future__ import annotations

from qkplast.options import AnalysisOptions

#: Version of :func:`~qkplast.stats.bootstrap.bootstrap`'s output: bump it when its variables or intervals change,
#: so run directories recompute their bootstrap instead of reusing a stale one.
SCHEMA_VERSION = 4  # 2: lo/hi are the inference policy's interval, basic in lo_basic/hi_basic; 3: below 8 documents
#                     the policy's standard error is the corrected estimate's own (leave-two-out values, jackknife2);
#                     4: the jackknife intervals on the logit / Fisher-z scale of each statistic's range (RANGES)

#: the words for each interval method, as tables and pages print them
INTERVAL_NAMES = {"jackknife": "jackknife-t", "jackknife_t": "jackknife-t", "jackknife_bc": "bias-corrected jackknife-t",
                  "jackknife_bc2": "two-level bias-corrected jackknife-t", "bca": "BCa",
                  "basic": "basic", "percentile": "percentile"}


def supports(options: AnalysisOptions) -> bool:
    """Whether :func:`~qkplast.stats.reweight.reweighted_statistics` reproduces the analysis for these options."""
    return (options.covariance, options.semantic_stats, options.positional_fit, options.query_position,
            options.pair_docs) == ("diagonal", "per_bucket", "global", "midpoint", "same")
