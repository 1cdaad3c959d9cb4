"""Results: metrics of one or many runs in, the book's tables and figures beside the thesis's numbers out.

The thesis's reported figures (:mod:`~qkplast.results.reference`), this project's tables against them
(:mod:`~qkplast.results.tables`), tables across the runs of a study (:mod:`~qkplast.results.crossrun`)
and the figures (:mod:`~qkplast.results.figures`, :mod:`~qkplast.results.extra_metrics`,
:mod:`~qkplast.results.intervention_figures`).
"""
