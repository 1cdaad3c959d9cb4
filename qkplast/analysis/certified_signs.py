"""Sums of the signs of many float64 dot products, from float32 products that a rounding bound certifies.

The Monte Carlo plasticity (thesis section 4.4, eq. 4.14 without the Gaussian
assumption) needs only the sign of every score ``q^T delta`` of a bucket's
queries against its key-pair differences: one ``[pair, dim] x [dim, query]``
product per head and bucket, the largest dense product of ``analyze()``. A
float32 product runs at twice the float64 rate on a CPU (more on most GPUs)
but may get a sign wrong where the score is near 0. :func:`sign_sums` computes
it in float32 and recomputes in float64 every pair whose smallest float32
score is within the rounding bound of 0, so the result equals what the float64
product gives: the sign of a certified float32 score is the sign of the exact
score, which is also the sign of the float64 score (the bound includes the
float64 product's own rounding error).

The bound (:func:`sign_bound`). Let ``q`` be a query and ``r`` a pair
difference (float64), ``q^ = fl32(q)``, ``r^ = fl32(r)`` and ``s^ = fl32(q^ . r^)``
summed in any order, with or without fused multiply-adds. With ``u = 2^-24``
and ``gamma_d = d u / (1 - d u)`` (Higham, *Accuracy and Stability of
Numerical Algorithms*, eq. 3.5), ``|s^ - q^ . r^| <= gamma_d sum |q^_i r^_i|``;
the two conversions add ``(2u + u^2) sum |q_i r_i|``, and the float64 product
is within ``gamma64_d sum |q_i r_i|`` of the exact ``q . r``. With
``sum |q_i r_i| <= ||q|| ||r||`` (Cauchy-Schwarz) a score with
``|s^| > K(d) ||q|| ||r||`` has the sign of the exact score and of the float64
one; the check uses the largest ``||q||`` of the bucket, one bound per pair.
Subnormal results add at most ``3 d 2^-150`` in absolute terms (covered by
``d 2^-126``); products with ``||q|| ||r|| >= 2^100``, which could overflow
float32, and matrix products that torch is set to run in TF32 or bfloat16
take the float64 product instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from qkplast.analysis.compiled import real_slot_signs
from qkplast.tensors import einsum, matmul, scratch

_U32, _U64 = 2.0**-24, 2.0**-53
_MAX_SCALE = 2.0**100  # ||q|| ||r|| below 2^100: no float32 product or partial sum can overflow
#: at most this fraction of uncertain rows is recomputed row by row; above it the float64 product is cheaper
_RECOMPUTE_FRACTION = 1 / 8


def sign_bound(dim: int) -> float:
    """``K(d)``: a float32 score with ``|s^| > K(d) ||q|| ||r||`` has the exact score's sign (module docstring).

    The factor 1.01 covers the rounding of the norms ``||q||`` and ``||r||`` themselves.
    """
    gamma32 = dim * _U32 / (1 - dim * _U32)
    gamma64 = dim * _U64 / (1 - dim * _U64)
    return 1.01 * (gamma32 * (1 + _U32) ** 2 + 2 * _U32 + _U32**2 + gamma64)


def float32_products_are_exact_ieee(device: torch.device) -> bool:
    """Whether torch runs float32 matrix products on ``device`` in float32 (not TF32 or bfloat16).

    The setting of the matmul backend wins over the backend's, which wins over
    the global ``torch.backends.fp32_precision``; "none" defers to the next.
    """
    backend = torch.backends.cuda if device.type == "cuda" else torch.backends.mkldnn
    for precision in (getattr(backend.matmul, "fp32_precision", "none"), getattr(backend, "fp32_precision", "none"),
                      getattr(torch.backends, "fp32_precision", "none")):
        if precision != "none":
            return precision == "ieee"
    return True


def bucket_rows(x: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor | None, name: str = "bucket_rows") -> torch.Tensor:
    """``x[:, idx]`` ``[head, bucket, slot, dim]`` for ``x`` ``[head, sample, dim]`` and ``idx`` ``[bucket, slot]``,
    padding slots (``mask`` False) zero (left as gathered when ``mask`` is None); in a scratch buffer
    (:func:`qkplast.tensors.scratch`) named ``name``."""
    out = scratch(name, (x.shape[0], idx.numel(), x.shape[-1]), x)
    out = torch.index_select(x, 1, idx.reshape(-1), out=out).view(x.shape[0], *idx.shape, x.shape[-1])
    return out if mask is None or bool(mask.all()) else out.mul_(mask[None, :, :, None].to(x.dtype))


def float64_sign_sums(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``sum_n sign(rows[..., p, :] . cols[..., n, :])`` ``[..., pair]`` from one float64 product (the reference)."""
    score = matmul(rows, cols.transpose(-1, -2))  # [..., pair, query]
    return torch.sign(score, out=score).sum(-1)


@dataclass
class PairRows:
    """Pair differences ``keys[:, pi] - keys[:, pj]`` ``[head, bucket, pair, dim]`` known through their float32 copy
    ``rows32`` and float64 squared norms ``square_sums`` ``[head, bucket, pair]``
    (:func:`qkplast.analysis.compiled.pair_terms` writes both in its pass over the pairs): the float64 rows
    themselves are formed only where needed, the same values as the full tensor holds."""

    keys: torch.Tensor  # [head, sample, dim] float64
    pi: torch.Tensor  # [bucket, pair]
    pj: torch.Tensor
    rows32: torch.Tensor  # [head, bucket, pair, dim] float32
    square_sums: torch.Tensor  # [head, bucket, pair] float64

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.rows32.shape)

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def select(self, h: torch.Tensor, b: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The float64 rows ``[n, dim]`` of the given (head, bucket, pair) triples."""
        return self.keys[h, self.pi[b, p]] - self.keys[h, self.pj[b, p]]

    def full(self) -> torch.Tensor:
        """Every float64 row ``[head, bucket, pair, dim]``."""
        return self.keys[:, self.pi] - self.keys[:, self.pj]


def sign_sums(rows: torch.Tensor | PairRows, queries: torch.Tensor, qidx: torch.Tensor,
              qmask: torch.Tensor) -> torch.Tensor:
    """Sums over each bucket's queries of ``sign(r_p . q_n)``, equal to :func:`float64_sign_sums`, from a float32 product.

    Parameters
    ----------
    rows : Tensor ``[head, bucket, pair, dim]`` or PairRows
        float64 pair differences ``r`` (or their float32 copy and norms, :class:`PairRows`).
    queries : Tensor ``[head, sample, dim]``
        float64 queries.
    qidx, qmask : Tensor ``[bucket, slot]``
        Each bucket's query samples, padded; ``qmask`` is True for real ones.

    Returns
    -------
    Tensor ``[head, bucket, pair]``, float64: each sum exact (signs are small
    integers), over the bucket's real queries. A sum can differ from the
    float64 product's only through a score within float64 rounding of 0,
    whose sign depends on the order in which a product is summed (uncertain
    scores are recomputed as products and a sum, not by the BLAS).
    """
    known = isinstance(rows, PairRows)

    def in_float64():
        return float64_sign_sums(rows.full() if known else rows, bucket_rows(queries, qidx, qmask))

    def select(h, b, p):
        return rows.select(h, b, p) if known else rows[h, b, p]

    if not float32_products_are_exact_ieee(rows.device):
        return in_float64()
    dim = rows.shape[-1]
    f32 = torch.empty(0, dtype=torch.float32, device=rows.device)
    qnorm = torch.linalg.vector_norm(queries, dim=-1)  # [head, sample]
    qmax = (qnorm[:, qidx] * qmask).amax(-1)  # [head, bucket]: largest norm of each bucket's queries
    q32 = scratch("sign_queries32", tuple(queries.shape), f32).copy_(queries)  # [head, sample, dim]
    c32 = bucket_rows(q32, qidx, None, "sign_cols32")  # [head, bucket, slot, dim]; padding scores are set below
    if known:  # ||r|| from the float64 sum of squares (its rounding is inside sign_bound's factor 1.01)
        r32, rnorm = rows.rows32, torch.sqrt(rows.square_sums)
    else:
        r32 = scratch("sign_rows32", tuple(rows.shape), f32).copy_(rows)  # [head, bucket, pair, dim]
        # ||r|| at most, from the float32 copy: |r_i| <= |r32_i| / (1 - u); a float32 sum of squares errs by
        # gamma_d relatively, plus 2^-150 per subnormal square or partial sum
        square_sum = einsum("...d,...d->...", r32, r32).to(torch.float64) + 2 * dim * 2.0**-149  # [head, bucket, pair]
        rnorm = torch.sqrt(square_sum * (1 + dim * _U32 / (1 - dim * _U32))) / (1 - _U32)
    scale = qmax[:, :, None] * rnorm  # [head, bucket, pair]: ||q|| ||r|| at most
    if not bool((scale < _MAX_SCALE).all()):  # inf when the float32 squares overflow
        return in_float64()
    score = matmul(r32, c32.transpose(-1, -2),
                   out=scratch("sign_scores32", (*rows.shape[:-1], qidx.shape[1]), f32))  # [head, bucket, pair, slot]
    nearest, sums = score_signs(score, qmask)  # [head, bucket, pair] each
    bound = sign_bound(dim) * scale + dim * torch.finfo(torch.float32).tiny  # [head, bucket, pair]
    unsure = nearest <= bound
    n_unsure = int(unsure.sum())
    if n_unsure > _RECOMPUTE_FRACTION * unsure.numel():
        return in_float64()
    if n_unsure:
        # the uncertain scores of the uncertain pairs, recomputed in float64; each replaces its float32 sign
        h, b, p = unsure.nonzero(as_tuple=True)
        # a difference of exact zeros (a padding pair, i = j) scores exactly 0 in float32 and float64 alike: its
        # signs are already right, and recomputing them (every query of the bucket) was most of this branch's work
        moving = select(h, b, p).ne(0).any(-1)
        h, b, p = h[moving], b[moving], p[moving]
        close = (score[h, b, p].abs() <= bound[h, b, p][:, None]) & qmask[b]  # [n_unsure, slot]: padding never
        row, slot = close.nonzero(as_tuple=True)
        h, b, p = h[row], b[row], p[row]
        exact = (select(h, b, p) * queries[h, qidx[b, slot]]).sum(-1)  # [n_scores]
        sums.index_put_((h, b, p), torch.sign(exact) - torch.sign(score[h, b, p, slot]).to(sums.dtype),
                        accumulate=True)
    return sums


def score_signs(score: torch.Tensor, qmask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest ``|score|`` (float32) and the sum of signs (float64) over each row's real slots
    ``[head, bucket, pair]``, from float32 scores ``[head, bucket, pair, slot]`` and the real slots ``qmask``
    ``[bucket, slot]``; ``score`` is left as it is. On the CPU one compiled pass
    (:func:`qkplast.analysis.compiled.real_slot_signs`), elsewhere torch operations; the same values (a minimum and
    a sum of small whole numbers are exact)."""
    if score.device.type == "cpu":
        return real_slot_signs(score, qmask)
    pad = ~qmask[None, :, None, :]  # [1, bucket, 1, slot]
    nearest = torch.abs(score).masked_fill_(pad, math.inf).amin(-1)  # padding is never the nearest
    sums = torch.sign(score).masked_fill_(pad, 0).sum(-1).to(torch.float64)  # float32 sums of +-1 are exact
    return nearest, sums
