"""qkplast: the geometry of post-RoPE queries and keys, and attention plasticity.

Executable companion to the thesis "Attention Plasticity and the Geometry of
Long-Context Failure" (University of Geneva, 2026).
"""

import warnings as _warnings

from qkplast._version import __version__  # noqa: E402,F401

# transformers imports tqdm.auto, which warns in every notebook kernel without ipywidgets; the progress
# bars qkplast shows are text ones, so the warning only adds machine-specific paths to notebook outputs.
_warnings.filterwarnings("ignore", message="IProgress not found")

from qkplast.lazy import lazy_names  # noqa: E402
from qkplast.options import AnalysisOptions, CaptureOptions  # noqa: E402

#: Where the public names not imported above live. They load on first use (PEP 562): ``import qkplast`` (and so
#: every ``qkplast`` command, which imports ``qkplast.pipeline.cli``) would otherwise import torch, scipy and xarray
#: first, about 3.5 s before ``qkplast --help`` or ``qkplast study --status`` prints a line, for work that never
#: touches a tensor.
_HOMES = {"analysis": ("analyze",),
          "capture_format": ("CaptureError", "open_capture", "open_dataset", "save_capture", "save_dataset",
                             "validate_capture")}

__all__ = [
    "__version__", "AnalysisOptions", "CaptureError", "CaptureOptions", "analyze", "open_capture", "open_dataset", "save_capture", "save_dataset",
    "validate_capture",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
