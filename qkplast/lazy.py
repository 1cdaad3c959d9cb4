"""Public names of a package loaded from their home modules on first use (PEP 562).

A subpackage's ``__init__`` names what it offers; importing the package must not import what those names need
(torch, scipy, xarray, transformers): a chapter reading a finished run, ``qkplast --help`` and ``qkplast study
--status`` never need them. :func:`lazy_names` gives the package's ``__getattr__`` and ``__dir__``, from a map of
home module to the names it defines.
"""

from __future__ import annotations

import sys
from importlib import import_module

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: dict[str, tuple[str, ...]], public: list[str]):
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``): each name of ``homes[module]`` is read from
    ``package.module`` when first asked for; ``public`` is the package's ``__all__``.

    Examples
    --------
    In ``qkplast/theory/__init__.py``::

        __getattr__, __dir__ = lazy_names(__name__, {"checks": ("check_lemma_a1",)}, __all__)
    """
    where = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str):
        home = where.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{home}"), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *public})

    return __getattr__, __dir__
