"""What readers of a finished analysis need from its code without running it: the version of
:func:`~qkplast.analysis.metrics.analyze`'s output (the key of a run directory's ``metrics.nc``) and the names of
the PCA taxonomy's classes (the values of its ``taxonomy`` variable).

Imports nothing: a chapter that opens a finished run and draws its figures reads these without importing torch
(:mod:`~qkplast.analysis.metrics` and :mod:`~qkplast.analysis.pca`, which compute, re-export them).
"""

#: Version of :func:`~qkplast.analysis.metrics.analyze`'s output: bump it when a metric is added, removed, renamed
#: or computed differently, so run directories recompute their metrics instead of reusing stale ones.
SCHEMA_VERSION = 3  # 2: the AP_drop decomposition rebuilt, listwise in the pass; 3: PCA components without variance get NaN correlations

#: The classes of :func:`~qkplast.analysis.pca.pca`'s taxonomy, in the order of its ``taxonomy`` labels.
TAXONOMY = ("position-dominated", "q-positional", "content-focused", "mixed")
