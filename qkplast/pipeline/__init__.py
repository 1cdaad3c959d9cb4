"""Pipeline: options in, a finished run directory, a study or the book out; the command line.

``qkplast run`` (the run's stages), ``-p`` parameters, studies on submitit, assembling the book and
:mod:`~qkplast.pipeline.cli`, the one place that catches :class:`qkplast.errors.QkplastError`.
"""
