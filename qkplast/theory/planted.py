"""Planted captures drawn from the positional-semantic model of appendix A.1.

Each head is generated in a *planted basis* and then turned by a random
orthogonal matrix ``R_h`` (so no analysis can profit from axis-aligned data):

* queries: coordinate 1 is ``alpha_pos + beta_pos t + sigma_pos eps`` (A.1),
  coordinates 2..d are ``N(mu_sem, Sigma_sem)`` (A.2), independent of eps;
* keys: coordinate 1 is ``key_slope t + key_offset + key_noise eps'``,
  coordinates 2..d are ``N(mu_key, key_noise^2 I)``.

Both drifts lie along planted coordinate 1, so the pooled drift axis a of the
rotation model is ``R_h e1``, the key slope ``alpha_K`` is ``key_slope`` and the
query slope ``alpha_Q`` is ``beta_pos``. :func:`true_query_moments` gives the
exact query mean and covariance at any position, from which the exact Gaussian
plasticity of any key pair follows.

``semantic="skewed"`` replaces the Gaussian semantic part with a rare-event
factor (a centred two-point variable along one direction plus a little Gaussian
noise): same first two moments as a Gaussian, very different tail mass, so the
Gaussian closed form and the Monte Carlo estimate must disagree.

Options beyond the thesis's model, for the tests and benchmarks that need a known answer:

* ``key_axis``: the planted coordinate the keys drift along (0: with the queries' drift, as above; 1 or
  more: a direction orthogonal to it, so the key drift lies off the query-drift axis);
* ``content_floor``: the query content spread (coordinates 2..d around their mean) shrinks linearly from
  1 at position 0 to ``content_floor`` at ``seq_len``, a content statistic that changes with position;
* ``doc_effect``: document-to-document variation, the reason documents are the unit of every interval.
  Each document draws its own shifts of the query and key content means, of the query intercept, and
  relative changes of both slopes and of the query content spread, all of size ``doc_effect``;
* ``world_seed``: the heads' parameters drawn from their own generator, so captures with different
  ``seed`` are independent samples (documents, positions) of one fixed world.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr


@dataclass
class PlantedTruth:
    """Planted parameters, one row per head; vectors are in the planted basis unless noted."""

    rotation: np.ndarray  # [head, dim, dim]  R_h: planted -> captured basis
    alpha_pos: np.ndarray  # [head]
    beta_pos: np.ndarray  # [head]
    sigma_pos: np.ndarray  # [head]
    mu_sem: np.ndarray  # [head, dim-1]
    cov_sem: np.ndarray  # [head, dim-1, dim-1]
    key_slope: np.ndarray  # [head]
    key_offset: np.ndarray  # [head]
    mu_key: np.ndarray  # [head, dim-1]
    key_noise: float

    @property
    def axis_a(self) -> np.ndarray:
        """Planted drift axis in the captured basis: ``R_h e1``  ``[head, dim]``."""
        return self.rotation[:, :, 0]


def random_orthogonal(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """``n`` Haar-random orthogonal ``d x d`` matrices (QR with the sign fix)."""
    z = rng.normal(size=(n, d, d))
    qm, r = np.linalg.qr(z)
    return qm * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]


def sample_positions(rng, n_docs, seq_len, bucket_size, samples_per_bucket):
    """Per document, ``samples_per_bucket`` distinct positions drawn uniformly inside every bucket."""
    pos, doc = [], []
    n_bucket = -(-seq_len // bucket_size)
    for d in range(n_docs):
        for b in range(n_bucket):
            lo, hi = b * bucket_size, min((b + 1) * bucket_size, seq_len)
            m = min(samples_per_bucket, hi - lo)
            pos.append(np.sort(rng.choice(np.arange(lo, hi), size=m, replace=False)))
            doc += [f"doc-{d:03d}"] * m
    return np.concatenate(pos), np.array(doc)


def planted_capture(
    n_heads: int = 4,
    dim: int = 16,
    seq_len: int = 4096,
    bucket_size: int = 256,
    n_docs: int = 32,
    samples_per_bucket: int = 4,
    beta_pos: float | np.ndarray = 2e-3,
    sigma_pos: float = 1.0,
    key_slope: float | np.ndarray = 1.5e-3,
    key_noise: float = 0.5,
    semantic: str = "gaussian",
    diagonal_semantic: bool = False,
    seed: int = 0,
    *,
    key_axis: int = 0,
    content_floor: float | None = None,
    doc_effect: float = 0.0,
    world_seed: int | None = None,
) -> tuple[xr.Dataset, PlantedTruth]:
    """A capture (the :mod:`qkplast.capture_format` contract) drawn from the planted model, and its truth.

    ``key_axis``, ``content_floor``, ``doc_effect`` and ``world_seed`` are described in the module
    docstring; their defaults give the model of appendix A.1 with the draws of earlier versions.
    """
    if semantic not in ("gaussian", "skewed"):
        raise ValueError(f"semantic must be 'gaussian' or 'skewed', got {semantic!r}")
    if not 0 <= key_axis < dim:
        raise ValueError(f"key_axis must lie in 0..{dim - 1}, got {key_axis}")
    if content_floor is not None and not 0 < content_floor:
        raise ValueError(f"content_floor must be positive, got {content_floor}")
    if doc_effect < 0:
        raise ValueError(f"doc_effect must be non-negative, got {doc_effect}")
    rng = np.random.default_rng(seed)
    world = rng if world_seed is None else np.random.default_rng([world_seed, 7])
    pos, doc = sample_positions(rng, n_docs, seq_len, bucket_size, samples_per_bucket)
    n, m = len(pos), dim - 1
    t = pos.astype(float)
    rot = random_orthogonal(world, n_heads, dim)
    beta = np.broadcast_to(np.asarray(beta_pos, float), (n_heads,)).copy()
    kslope = np.broadcast_to(np.asarray(key_slope, float), (n_heads,)).copy()
    alpha = world.normal(0.5, 0.2, n_heads)
    mu_sem = world.normal(0, 0.3, (n_heads, m))
    if diagonal_semantic:
        cov_sem = np.stack([np.eye(m)] * n_heads)
    else:
        # a correlated, well-conditioned covariance: eigenvalues in [0.3, 1.5]
        basis = random_orthogonal(world, n_heads, m)
        cov_sem = np.einsum("hij,hj,hkj->hik", basis, world.uniform(0.3, 1.5, (n_heads, m)), basis)
    mu_key = world.normal(0, 0.3, (n_heads, m))
    mu_key[:, 0] -= 1.0  # a clear Q/K centroid offset along planted coordinate 2
    key_offset = world.normal(-0.5, 0.2, n_heads)
    fx = document_effects(np.random.default_rng([seed, 11]), doc, n_heads, m, doc_effect)

    q1 = (alpha[:, None] + fx.q_intercept + beta[:, None] * fx.q_slope * t
          + sigma_pos * rng.normal(size=(n_heads, n)))  # [head, sample]
    if semantic == "gaussian":
        chol = np.linalg.cholesky(cov_sem)
        qs = mu_sem[:, None] + np.einsum("hij,hsj->hsi", chol, rng.normal(size=(n_heads, n, m)))
    else:
        # rare event along a fixed direction w: s in {0, 1}, P(s = 1) = 0.1, centred and scaled to unit variance
        w = rng.normal(size=(n_heads, m))
        w /= np.linalg.norm(w, axis=1, keepdims=True)
        s = (rng.random((n_heads, n)) < 0.1).astype(float)
        s = (s - 0.1) / 0.3
        qs = mu_sem[:, None] + 3.0 * s[..., None] * w[:, None] + 0.05 * rng.normal(size=(n_heads, n, m))
        cov_sem = 9.0 * np.einsum("hi,hj->hij", w, w) + 0.0025 * np.eye(m)
    if doc_effect or content_floor is not None:  # (skipped otherwise: the draws of earlier versions, bit for bit)
        spread = fx.q_spread  # [head, sample] each document's content scale
        if content_floor is not None:  # the content spread shrinks with position: a content statistic moving
            spread = spread * (1.0 - (1.0 - content_floor) * t / seq_len)[None, :]
        qs = mu_sem[:, None] + fx.q_content + spread[..., None] * (qs - mu_sem[:, None])
    drift = kslope[:, None] * fx.k_slope * t  # [head, sample]
    k1 = key_offset[:, None] + (drift if key_axis == 0 else 0.0) + key_noise * rng.normal(size=(n_heads, n))
    ks = mu_key[:, None] + fx.k_content + key_noise * rng.normal(size=(n_heads, n, m))
    if key_axis:  # off the query-drift axis: along planted coordinate key_axis + 1
        ks[..., key_axis - 1] += drift
    q = np.einsum("hij,hsj->hsi", rot, np.concatenate([q1[..., None], qs], -1))  # [head, sample, dim]
    k = np.einsum("hij,hsj->hsi", rot, np.concatenate([k1[..., None], ks], -1))

    n_q, n_kv = 9, 3
    layer, q_head = np.arange(n_heads) // n_q, np.arange(n_heads) % n_q
    capture = xr.Dataset(
        {"q": (("head", "sample", "dim"), q), "k": (("head", "sample", "dim"), k)},
        coords={
            "position": ("sample", pos.astype(np.int64)),
            "doc": ("sample", doc),
            "bucket": ("sample", (pos // bucket_size).astype(np.int64)),
            "token": ("sample", rng.integers(0, 1000, n).astype(np.int64)),
            "layer": ("head", layer.astype(np.int64)),
            "q_head": ("head", q_head.astype(np.int64)),
            "kv_head": ("head", (q_head // (n_q // n_kv)).astype(np.int64)),
            "rope": ("head", np.ones(n_heads, bool)),
        },
        attrs={
            "model": "planted-positional-semantic", "seq_len": seq_len, "bucket_size": bucket_size, "seed": seed,
            "dtype": "float64", "corpus": f"synthetic:{semantic}", "n_q_heads": n_q, "n_kv_heads": n_kv,
            "samples_per_bucket": samples_per_bucket, "n_docs": n_docs, "key_axis": key_axis,
            "doc_effect": doc_effect, **({"content_floor": content_floor} if content_floor is not None else {}),
        },
    )
    truth = PlantedTruth(rot, alpha, beta, np.full(n_heads, sigma_pos), mu_sem, cov_sem, kslope, key_offset,
                         mu_key, key_noise)
    return capture, truth


@dataclass
class DocumentEffects:
    """Per-sample values of the document-level random effects (all neutral when ``doc_effect = 0``)."""

    q_intercept: np.ndarray  # [head, sample] added to query coordinate 1
    q_slope: np.ndarray  # [head, sample] factor on the query drift
    q_content: np.ndarray  # [head, sample, dim-1] shift of the query content mean
    q_spread: np.ndarray  # [head, sample] factor on the query content spread
    k_content: np.ndarray  # [head, sample, dim-1] shift of the key content mean
    k_slope: np.ndarray  # [head, sample] factor on the key drift


def document_effects(rng: np.random.Generator, doc: np.ndarray, n_heads: int, m: int, size: float) -> DocumentEffects:
    """Each document's random effects (one draw per head and document), spread to its samples.

    Shifts are ``N(0, size^2)``; factors are ``exp(size z / 2)`` with ``z ~ N(0, 1)`` (positive, median 1).
    With ``size = 0`` every shift is 0 and every factor 1, and ``rng`` is not used.
    """
    n = len(doc)
    if size == 0:
        zeros, ones = np.zeros((n_heads, n)), np.ones((n_heads, n))
        return DocumentEffects(zeros, ones, np.zeros((n_heads, n, m)), ones, np.zeros((n_heads, n, m)), ones)
    _, code = np.unique(doc, return_inverse=True)
    n_doc = int(code.max()) + 1
    shift = lambda *shape: size * rng.normal(size=(n_heads, n_doc, *shape))  # noqa: E731
    factor = lambda: np.exp(0.5 * size * rng.normal(size=(n_heads, n_doc)))  # noqa: E731
    per_sample = lambda x: x[:, code]  # noqa: E731  [head, doc, ...] -> [head, sample, ...]
    return DocumentEffects(per_sample(shift()), per_sample(factor()), per_sample(shift(m)), per_sample(factor()),
                           per_sample(shift(m)), per_sample(factor()))


def true_query_moments(truth: PlantedTruth, t: np.ndarray):
    """Exact query mean ``[head, len(t), dim]`` and covariance ``[head, dim, dim]`` in the captured basis."""
    t = np.asarray(t, float)
    n_heads, dim = truth.rotation.shape[:2]
    mean = np.zeros((n_heads, len(t), dim))
    mean[..., 0] = truth.alpha_pos[:, None] + truth.beta_pos[:, None] * t
    mean[..., 1:] = truth.mu_sem[:, None]
    cov = np.zeros((n_heads, dim, dim))
    cov[:, 0, 0] = truth.sigma_pos**2
    cov[:, 1:, 1:] = truth.cov_sem
    rot = truth.rotation
    return np.einsum("hij,htj->hti", rot, mean), np.einsum("hij,hjk,hlk->hil", rot, cov, rot)
