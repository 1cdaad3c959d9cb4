"""qkplast: the geometry of post-RoPE queries and keys, and attention plasticity.

Executable companion to the thesis "Attention Plasticity and the Geometry of
Long-Context Failure" (University of Geneva, 2026).
"""

import warnings as _warnings

from qkplast._version import __version__  # noqa: E402,F401

# transformers imports tqdm.auto, which warns in every notebook kernel without ipywidgets; the progress
# bars qkplast shows are text ones, so the warning only adds machine-specific paths to notebook outputs.
_warnings.filterwarnings("ignore", message="IProgress not found")

from qkplast.options import AnalysisOptions, CaptureOptions  # noqa: E402

#: Public names whose modules import numpy, xarray or torch: loaded on first use (below).
_CAPTURE_FORMAT = ("CaptureError", "open_capture", "open_dataset", "save_capture", "save_dataset", "validate_capture")


def __getattr__(name: str):
    """``qkplast.analyze`` and the capture-format functions, imported on first use (PEP 562).

    ``import qkplast`` (and so every ``qkplast`` command, which imports ``qkplast.pipeline.cli``) would otherwise
    import torch, scipy and xarray first: about 3.5 s before ``qkplast --help`` or ``qkplast study --status``
    prints a line, for work that never touches a tensor.
    """
    if name == "analyze":
        from qkplast.analysis import analyze

        return analyze
    if name in _CAPTURE_FORMAT:
        from qkplast import capture_format

        return getattr(capture_format, name)
    raise AttributeError(f"module 'qkplast' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "__version__", "AnalysisOptions", "CaptureError", "CaptureOptions", "analyze", "open_capture", "open_dataset", "save_capture", "save_dataset",
    "validate_capture",
]
