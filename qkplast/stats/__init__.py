"""Statistics: captures and metrics in, intervals, permutation nulls and verdicts out.

Documents are the unit of every interval on a capture. :func:`bootstrap` (:mod:`~qkplast.stats.bootstrap`)
resamples documents, through the reweighted sufficient statistics of :mod:`~qkplast.stats.reweight`;
:mod:`~qkplast.stats.nulls` holds the corrections page's permutation nulls and
:mod:`~qkplast.stats.verdict` turns an estimate and its null into a verdict word.
"""

from qkplast.stats.bootstrap import bca_interval, bootstrap, document_interval, document_jackknife
from qkplast.stats.reweight import reweighted_statistics
from qkplast.stats.intervals import interval_policy, jackknife_t, t_interval
from qkplast.stats.verdict import conjunction, holm, null_verdict, verdict

__all__ = ["bca_interval", "bootstrap", "conjunction", "document_interval", "document_jackknife", "holm", "interval_policy",
           "jackknife_t", "null_verdict", "reweighted_statistics", "t_interval", "verdict"]
