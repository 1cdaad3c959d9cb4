"""Statistics: captures and metrics in, intervals, permutation nulls and verdicts out.

Documents are the unit of every interval on a capture. :func:`bootstrap` (:mod:`~qkplast.stats.bootstrap`)
resamples documents, through the reweighted sufficient statistics of :mod:`~qkplast.stats.reweight`;
:mod:`~qkplast.stats.nulls` holds the corrections page's permutation nulls and
:mod:`~qkplast.stats.decision` turns an estimate, its interval and its null into a verdict word.
"""

from qkplast.stats.bootstrap import bca_interval, bootstrap
from qkplast.stats.reweight import reweighted_statistics
from qkplast.stats.intervals import t_interval
from qkplast.stats.decision import conjunction, holm, null_verdict, verdict

__all__ = ["bca_interval", "bootstrap", "conjunction", "holm", "null_verdict", "reweighted_statistics", "t_interval", "verdict"]
