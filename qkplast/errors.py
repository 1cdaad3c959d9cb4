"""The package's one exception base.

Every error qkplast raises on purpose (bad input, a corpus too short, a model
that cannot be loaded, a failed batch step) derives from :class:`QkplastError`,
so the command line catches exactly these at one site and prints one line
instead of a traceback, while genuine bugs still show theirs.
``QkplastError`` is a :class:`ValueError` so code that caught ``ValueError``
before keeps working.
"""

from __future__ import annotations

__all__ = ["QkplastError"]


class QkplastError(ValueError):
    """Base of every error qkplast raises for bad input or an unusable setting; the message names the fix."""
