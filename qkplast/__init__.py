"""qkplast: the geometry of post-RoPE queries and keys, and attention plasticity.

Executable companion to the thesis "Attention Plasticity and the Geometry of
Long-Context Failure" (University of Geneva, 2026).
"""

from .io import CaptureError, open_capture, open_dataset, save_capture, save_dataset, validate_capture

__version__ = "0.1.0"

__all__ = ["CaptureError", "open_capture", "open_dataset", "save_capture", "save_dataset", "validate_capture"]
