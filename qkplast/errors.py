"""The package's one exception base, and the one error the core raises for a model.

Every error qkplast raises on purpose (bad input, a corpus too short, a model
that cannot be loaded, a failed batch step) derives from :class:`QkplastError`,
so the command line catches exactly these at one site and prints one line
instead of a traceback, while genuine bugs still show theirs.
``QkplastError`` is a :class:`ValueError` so code that caught ``ValueError``
before keeps working.

:class:`ModelError` belongs to the model code (:mod:`qkplast.capture.models`
raises it and exports it), but :func:`qkplast.options.split_revision` raises it
too, for a malformed ``NAME@REVISION`` while :class:`~qkplast.options.CaptureOptions`
is built, and the core may not import ``capture``: so it is defined here, below both.
"""

from __future__ import annotations

__all__ = ["ModelError", "QkplastError"]


class QkplastError(ValueError):
    """Base of every error qkplast raises for bad input or an unusable setting; the message names the fix."""


class ModelError(QkplastError):
    """A model cannot be found, loaded or used with the requested settings (the message names the fix)."""
