"""qkplast: the geometry of post-RoPE queries and keys, and attention plasticity.

Executable companion to the thesis "Attention Plasticity and the Geometry of
Long-Context Failure" (University of Geneva, 2026).
"""

import warnings as _warnings

__version__ = "0.1.0"

# transformers imports tqdm.auto, which warns in every notebook kernel without ipywidgets; the progress
# bars qkplast shows are text ones, so the warning only adds machine-specific paths to notebook outputs.
_warnings.filterwarnings("ignore", message="IProgress not found")

from .io import CaptureError, open_capture, open_dataset, save_capture, save_dataset, validate_capture  # noqa: E402
from .options import AnalysisOptions, CaptureOptions  # noqa: E402
from .analyze import analyze  # noqa: E402

__all__ = [
    "AnalysisOptions", "CaptureError", "CaptureOptions", "analyze", "open_capture", "open_dataset", "save_capture", "save_dataset",
    "validate_capture",
]
