"""Files shipped with the package: where the notebooks and the thesis's reference tables are (the checkout's folders, or the wheel's copies).

In a checkout (an editable install) the repository's ``notebooks/``, ``data/thesis/``, ``data/corpora/`` (the
pinned corpus snapshots) and ``studies/`` are used as they are. A non-editable install (``pip install .``, a
wheel) has no checkout beside the package: the build copies those folders into the package as
``qkplast/_shipped/`` (``setup.py``), and they are read from there.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SHIPPED", "resource_dir"]

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent
#: The copies a wheel ships (written by setup.py's build step; absent in a checkout).
SHIPPED = _PACKAGE / "_shipped"


def resource_dir(relative: str) -> Path:
    """``relative`` (``notebooks``, ``data/thesis``, ``data``, ``data/corpora``, ``data/miniature-full``, ``studies``)
    in the checkout when the package runs from one, else the wheel's copy under :data:`SHIPPED`."""
    checkout = _CHECKOUT / relative
    if (_CHECKOUT / "pyproject.toml").is_file() and checkout.is_dir():
        return checkout
    return SHIPPED / relative
