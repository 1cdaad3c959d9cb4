"""Shared fixtures. Every random draw in the tests starts from a fixed seed."""

import os
import random

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SEED = 20260


@pytest.fixture(autouse=True)
def _fixed_seeds():
    random.seed(SEED)
    np.random.seed(SEED)
    try:
        import torch

        torch.manual_seed(SEED)
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(SEED)


@pytest.fixture
def fast_capture_options():
    """The short capture setting of fast tests: 2048-token windows of pydoc-topics (qkplast.options.PRESETS)."""
    from qkplast.options import PRESETS

    return PRESETS["fast"]
