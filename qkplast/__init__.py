"""qkplast: the geometry of post-RoPE queries and keys, and attention plasticity.

Executable companion to the thesis "Attention Plasticity and the Geometry of
Long-Context Failure" (University of Geneva, 2026).
"""

import warnings as _warnings

from qkplast._version import __version__  # noqa: E402,F401

# transformers imports tqdm.auto, which warns in every notebook kernel without ipywidgets; the progress
# bars qkplast shows are text ones, so the warning only adds machine-specific paths to notebook outputs.
_warnings.filterwarnings("ignore", message="IProgress not found")

from qkplast.capture_format import CaptureError, open_capture, open_dataset, save_capture, save_dataset, validate_capture  # noqa: E402
from qkplast.options import AnalysisOptions, CaptureOptions  # noqa: E402
from qkplast.analysis import analyze  # noqa: E402

__all__ = [
    "__version__", "AnalysisOptions", "CaptureError", "CaptureOptions", "analyze", "open_capture", "open_dataset", "save_capture", "save_dataset",
    "validate_capture",
]
