"""Householder reflection (eq. 4.10): exact at +e1 and -e1, accurate near them, where the naive form fails."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from qkplast.analysis.linalg import householder_apply, householder_matrix, householder_vector


def reflect(x):
    x = torch.as_tensor(np.asarray(x, float))[None]
    h = householder_matrix(householder_vector(x))[0]
    return h, (h @ x[0]).numpy()


def e1(d, sign=1.0):
    v = np.zeros(d)
    v[0] = sign
    return v


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_exact_at_plus_and_minus_e1(sign):
    h, y = reflect(e1(6, sign))
    np.testing.assert_array_equal(y, e1(6))
    np.testing.assert_allclose(h.numpy() @ h.numpy().T, np.eye(6), atol=1e-15)
    if sign > 0:
        np.testing.assert_array_equal(h.numpy(), np.eye(6))


@pytest.mark.parametrize("eps", [1e-4, 1e-8, 1e-12, 1e-15])
def test_near_e1_keeps_precision_where_naive_form_fails(eps, rng):
    x = e1(64) + eps * rng.normal(size=64)
    x /= np.linalg.norm(x)
    h, y = reflect(x)
    assert np.abs(y - e1(64)).max() < 1e-15
    np.testing.assert_allclose(h.numpy() @ h.numpy().T, np.eye(64), atol=1e-15)
    # The thesis's u = x - e1: its first entry cancels, and H x drifts off e1.
    u = x - e1(64)
    naive = x - 2 * u * (u @ x) / (u @ u)
    if eps <= 1e-8:  # the naive tail error grows like 1e-16 / eps; the stable one stays at rounding level
        assert np.abs(naive - e1(64)).max() > 1e3 * max(np.abs(y - e1(64)).max(), 1e-30)
        assert np.abs(naive - e1(64)).max() > min(1e-12, 0.5 * eps)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, 12, elements=st.floats(-1e3, 1e3, allow_nan=False)).filter(lambda v: np.linalg.norm(v) > 1e-6))
def test_maps_any_direction_to_norm_e1_and_is_orthogonal(x):
    h, y = reflect(x)
    n = np.linalg.norm(x)
    np.testing.assert_allclose(y, n * e1(12), atol=1e-12 * n)
    np.testing.assert_allclose(h.numpy() @ h.numpy().T, np.eye(12), atol=1e-13)


def test_apply_matches_matrix_and_preserves_dot_products(rng):
    beta = torch.as_tensor(rng.normal(size=(3, 10)))
    y = torch.as_tensor(rng.normal(size=(3, 7, 10)))
    u = householder_vector(beta)
    direct = torch.einsum("hij,hsj->hsi", householder_matrix(u), y)
    torch.testing.assert_close(householder_apply(u, y), direct, rtol=0, atol=1e-13)
    z = householder_apply(u, y)
    torch.testing.assert_close(z @ z.transpose(1, 2), y @ y.transpose(1, 2), rtol=1e-12, atol=1e-12)


def test_zero_direction_is_an_error():
    with pytest.raises(ValueError, match="zero"):
        householder_vector(torch.zeros(1, 4, dtype=torch.float64))
