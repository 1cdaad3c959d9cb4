"""Analysis: a capture in, per-head metrics out (thesis sections 4.2-4.4 and the chapters beyond it).

Never loads a model. :func:`analyze` (:mod:`~qkplast.analysis.metrics`) makes one pass over the heads:
shared cloud moments (:mod:`~qkplast.analysis.moments`), PCA (:mod:`~qkplast.analysis.pca`), the planar
rotation model (:mod:`~qkplast.analysis.rotation`) and attention plasticity
(:mod:`~qkplast.analysis.plasticity`, on the key pairs of :mod:`~qkplast.analysis.pairs` and with certified
Monte Carlo signs in :mod:`~qkplast.analysis.certified_signs`),
then listwise plasticity (:mod:`~qkplast.analysis.listwise`) and the AP_drop decomposition
(:mod:`~qkplast.analysis.decompose`). :mod:`~qkplast.analysis.gqa` and :mod:`~qkplast.analysis.pooling`
read metrics or captures for their own questions; :mod:`~qkplast.analysis.schema` holds what readers of a
finished analysis need without running it. :mod:`~qkplast.analysis.cuts` analyses many cuts of one capture at once
(a jackknife's left-out captures, reseeded baselines), batched over a leading axis.
"""

from qkplast.lazy import lazy_names

# pca, rotation, plasticity and listwise are both modules and their one public function: the functions stay
# in their modules (qkplast.analysis.pca.pca, ...) so that the module names are not shadowed here
__all__ = ["PlasticityWarning", "analyze", "decompose_drop", "pooling_table", "thesis_metrics"]

#: Where each public name lives. The names load on first use (PEP 562): every one of these modules imports torch,
#: which a reader of a finished run (its metrics' schema version and taxonomy, :mod:`~qkplast.analysis.schema`)
#: never needs.
_HOMES = {
    "decompose": ("decompose_drop",),
    "metrics": ("analyze", "thesis_metrics"),
    "pairs": ("PlasticityWarning",),
    "pooling": ("pooling_table",),
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
