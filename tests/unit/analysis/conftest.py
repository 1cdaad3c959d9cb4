"""Shared by the analysis unit tests: a planted Gaussian capture, and the plasticity run quietly (bucket 0 has no
earlier keys by design, which PlasticityWarning reports)."""

import warnings

import pytest

from qkplast.analysis.plasticity import PlasticityWarning, plasticity
from qkplast.theory.planted import planted_capture


def quiet_plasticity(cap, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 has no earlier keys by design
        return plasticity(cap, **kw)


@pytest.fixture(scope="module")
def gaussian():
    return planted_capture(n_heads=3, dim=16, n_docs=64, samples_per_bucket=8, seed=1)
