"""Position-shuffle nulls of the rotation model's statistics (thesis eqs. 4.3-4.6; corrections page, items 5 and 9).

A position shuffle permutes the token positions across samples (one permutation for every head; a sample's query
and key keep their common position): the vectors stay untouched and every relation to position is destroyed. The
rotation model's position quantities are linear in the centred positions, so each permutation needs only the
position sums ``B_Q = Q_c^T t_p`` and ``B_K = K_c^T t_p`` (:func:`position_shuffle_null`), batched over
permutations on the device of :func:`qkplast.tensors.resolve_device` in float64; :func:`position_shuffle_nulls` lets
several statistics read the same sums (:func:`slope_nulls`: both of the corrections page's in one pass).

* :func:`drift_axis_parts`: the drift-axis part ``bias_strength`` and the full key-position slope
  ``mu_Q^T beta_K`` from the position sums;
* :func:`key_slope_sign_null`: the share of heads whose full slope has the sign of their bias strength
  (:func:`slope_sign_agreement`), against the shuffle (item 5). :func:`qkplast.stats.nulls.off_axis_null` (item 9,
  :func:`off_axis_slope`) is the other statistic built on it.
"""

from __future__ import annotations

import torch

from qkplast.tensors import as_f64, resolve_device


def position_shuffle_nulls(capture, statistics: dict, n_perm: int = 1000, seed: int = 0, chunk: int = 50) -> dict:
    """Statistics of the rotation model against one position shuffle: observed and ``n_perm`` null values of each.

    The token positions are permuted across samples (one permutation for all heads; a sample's query and
    key keep their common position), which leaves the vectors untouched and destroys any relation to
    position. The rotation model's quantities are linear in the centred positions, so every permutation
    needs only ``B_Q = Q_c^T t_p`` and ``B_K = K_c^T t_p``; they are formed once per chunk of permutations and
    every statistic reads them, so each gets exactly the values it would get alone.

    Parameters
    ----------
    capture : xarray.Dataset
        A capture with ``q``, ``k`` ``[head, sample, dim]`` and ``position`` ``[sample]``.
    statistics : dict of str to callable
        Each ``statistic(b_q, b_k, mu_q, stt)`` with ``b_q``, ``b_k`` ``[head, perm, dim]``, ``mu_q`` ``[head, dim]``
        and ``stt = sum (t - t_bar)^2``; returns ``[perm]``.
    n_perm : int
        Null replicates.
    seed : int
        Seed of the permutations (drawn on the CPU, so the same on every device).
    chunk : int
        Permutations per batch.

    Returns
    -------
    dict
        Per name of ``statistics``, ``{"observed": float, "null": numpy.ndarray of n_perm values}``.
    """
    dev = resolve_device("auto")
    q, k = as_f64(capture["q"], dev), as_f64(capture["k"], dev)  # [head, sample, dim]
    t = as_f64(capture["position"], dev)
    qc, kc = q - q.mean(1, keepdim=True), k - k.mean(1, keepdim=True)
    mu_q = q.mean(1)  # [head, dim]
    tc = t - t.mean()
    stt = float(tc @ tc)

    h, n, d = qc.shape
    # [(head dim), sample] once: the product torch.einsum("hsd,ps->hpd") makes, without the copy of the clouds it
    # makes on every call (the same values, in the same [head, perm, dim] view)
    qt, kt = (x.transpose(1, 2).reshape(h * d, n) for x in (qc, kc))

    def sums(tp):  # tp [perm, sample] centred positions -> the position sums B_Q, B_K [head, perm, dim]
        return tuple(torch.matmul(x, tp.T).view(h, d, -1).transpose(1, 2) for x in (qt, kt))

    b_q, b_k = sums(tc[None])
    out = {name: {"observed": float(f(b_q, b_k, mu_q, stt)[0]), "null": []} for name, f in statistics.items()}
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for s in range(0, n_perm, chunk):
        m = min(chunk, n_perm - s)
        perm = torch.argsort(torch.rand(m, t.numel(), generator=gen), dim=-1).to(dev)  # [perm, sample]
        b_q, b_k = sums(tc[perm])
        for name, f in statistics.items():
            out[name]["null"].append(f(b_q, b_k, mu_q, stt))
    for res in out.values():
        res["null"] = torch.cat(res["null"]).cpu().numpy()
    return out


def position_shuffle_null(capture, statistic, n_perm: int = 1000, seed: int = 0, chunk: int = 50) -> dict:
    """A statistic of the rotation model against a position shuffle: observed and ``n_perm`` null values.

    :func:`position_shuffle_nulls` with the one statistic ``statistic(b_q, b_k, mu_q, stt)`` (``b_q``, ``b_k``
    ``[head, perm, dim]``, ``mu_q`` ``[head, dim]``, ``stt = sum (t - t_bar)^2``; returns ``[perm]``); ``seed``
    seeds the permutations (drawn on the CPU), ``chunk`` of them per batch.

    Returns
    -------
    dict
        ``observed`` (float) and ``null`` (``numpy.ndarray`` of ``n_perm`` values).
    """
    return position_shuffle_nulls(capture, {"statistic": statistic}, n_perm, seed, chunk)["statistic"]


def drift_axis_parts(b_q, b_k, mu_q):
    """``bias_strength`` and the full key-position slope ``mu_Q^T B_K`` from the position sums (eqs. 4.3-4.6).

    Parameters
    ----------
    b_q, b_k : torch.Tensor
        Position sums of the centred queries and keys, ``[head, perm, dim]``.
    mu_q : torch.Tensor
        Mean query, ``[head, dim]``.

    Returns
    -------
    tuple of torch.Tensor
        ``(bias, slope)``, each ``[head, perm]`` and each ``stt = sum (t - t_bar)^2`` times its quantity: the
        drift-axis part ``(a^T mu_Q)(a^T B_K)`` with ``a`` the pooled cloud's drift axis, and ``mu_Q^T B_K``.
    """
    c = b_q + b_k
    a = c / torch.linalg.vector_norm(c, dim=-1, keepdim=True)  # the pooled cloud's drift axis
    bias = (a * mu_q[:, None]).sum(-1) * (a * b_k).sum(-1)
    return bias, (mu_q[:, None] * b_k).sum(-1)


def slope_sign_agreement(b_q, b_k, mu_q, stt):
    """The share of heads whose full key-position slope has the sign of their bias strength ``[perm]`` (the common
    scale ``1/Var(t)`` drops out of signs): :func:`key_slope_sign_null`'s statistic."""
    bias, slope_full = drift_axis_parts(b_q, b_k, mu_q)
    return (torch.sign(bias) == torch.sign(slope_full)).to(torch.float64).mean(0)  # [perm]


def off_axis_slope(b_q, b_k, mu_q, stt):
    """``mean_h (key_position_slope - bias_strength)`` ``[perm]``, the part of the key-position slope off the drift
    axis (:func:`qkplast.stats.nulls.off_axis_null`'s statistic)."""
    bias, slope = drift_axis_parts(b_q, b_k, mu_q)
    return ((slope - bias) / stt).mean(0)  # [perm]


#: The rotation model's statistics against the position shuffle on the corrections page (items 5 and 9).
SLOPE_STATISTICS = {"key_slope_sign": slope_sign_agreement, "off_axis": off_axis_slope}


def slope_nulls(capture, n_perm: int = 1000, seed: int = 0, chunk: int = 50) -> dict:
    """:data:`SLOPE_STATISTICS` against one position shuffle (:func:`position_shuffle_nulls`): each value is
    :func:`key_slope_sign_null`'s or :func:`qkplast.stats.nulls.off_axis_null`'s with the same arguments.

    Returns
    -------
    dict
        ``{"key_slope_sign": {"observed", "null"}, "off_axis": {"observed", "null"}}``.
    """
    return position_shuffle_nulls(capture, SLOPE_STATISTICS, n_perm, seed, chunk)


def key_slope_sign_null(capture, n_perm: int = 1000, seed: int = 0, chunk: int = 50) -> dict:
    """Sign agreement of ``key_position_slope`` (``mu_Q^T beta_K``) with ``bias_strength``, against a position shuffle.

    Observed: the share of heads whose full key-position slope has the sign of their bias strength; null:
    :func:`position_shuffle_null` (the common scale ``1/Var(t)`` drops out of signs).

    Parameters
    ----------
    capture : xarray.Dataset
        A capture with ``q``, ``k`` and ``position``.
    n_perm, seed, chunk
        As in :func:`position_shuffle_null`.

    Returns
    -------
    dict
        ``observed`` (the share) and ``null`` (the ``n_perm`` shares).
    """

    return position_shuffle_null(capture, slope_sign_agreement, n_perm, seed, chunk)


__all__ = ["SLOPE_STATISTICS", "drift_axis_parts", "key_slope_sign_null", "off_axis_slope", "position_shuffle_null",
           "position_shuffle_nulls", "slope_nulls", "slope_sign_agreement"]
