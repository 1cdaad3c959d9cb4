"""Numeric checks of the plasticity decay argument (Theorem 4.4, Lemmas A.1 and A.2).

Each ``check_*`` function returns a :class:`CheckResult`: a pass/fail verdict
on the claim, one summary line, and a table of the numbers behind it. The
claims are tested where they could fail: simulated moments against the stated
formulas with standard-error tolerances, bounds evaluated on grids of t.

Explicit constants (the thesis leaves C0 and T0 implicit):

* the thesis's route. The Mills bound ``1 - Phi(z) <= phi(z)/z`` gives
  ``PP <= 4 phi(|z|)/|z|``; dropping ``1/|z|`` needs ``|z| >= 1``, and
  ``|z(t)| >= |gamma| t / 2`` needs ``t >= 2|z0|/|gamma|``. Hence
  ``C0 = 4/sqrt(2 pi)`` and ``T0 = 2 max(|z0|, 1)/|gamma|``;
* a sharper route. ``4 Phi(z) Phi(-z) <= exp(-z^2/2)`` for every real z, so
  ``C0 = 1`` and ``T0 = 2|z0|/|gamma|`` suffice. Proof: the product is even in
  z; for ``z >= 4/sqrt(2 pi)`` the Mills bound gives
  ``4 Phi(z) Phi(-z) <= 4 phi(z)/z <= exp(-z^2/2)``, and on ``[0, 4/sqrt(2 pi)]``
  (about ``[0, 1.6]``) :func:`sharp_inequality` checks it on a fine grid.

Theorem 4.4 is proved for a *fixed finite* pair set (what
:func:`check_theorem_4_4` checks). For the population ``AP_t`` of
Definition 4.3, where ``delta_1`` is continuous with a density at 0, the limit
still holds but the rate is ``Theta(1/t)``, not ``exp(-c t^2)``:
:func:`population_ap` and :func:`check_population_rate` compute it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from qkplast.theory.planted import random_orthogonal

# scipy.stats (about a second to import) is imported by the functions that use it: CheckResult and the Lemma A.2
# constants are read by chapters that draw a finished run's figures or a model's RoPE, which never need it

C0_MILLS = 4 / math.sqrt(2 * math.pi)
#: ``int 4 Phi(u) Phi(-u) du`` over the real line: ``4 / sqrt(pi)`` (``int Phi (1 - Phi) = E|X - Y| / 2``).
PP_INTEGRAL = 4 / math.sqrt(math.pi)


@dataclass
class CheckResult:
    """Outcome of one numeric check."""

    name: str
    passed: bool
    summary: str
    table: pd.DataFrame = field(repr=False)
    details: dict = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'} {self.name}: {self.summary}"

    def _repr_html_(self) -> str:
        head = f"<p><b>{'PASS' if self.passed else 'FAIL'}</b> {self.name}: {self.summary}</p>"
        # a check's table can hold hundreds of rows (one per planted case); a page shows its ends, the object keeps all
        return head + self.table.to_html(float_format=lambda v: f"{v:.4g}", max_rows=10)

    def assert_passed(self) -> "CheckResult":
        if not self.passed:
            raise AssertionError(repr(self))
        return self


def pp_from_z(z: np.ndarray) -> np.ndarray:
    """Pairwise plasticity ``4 Phi(z) Phi(-z)`` (eq. 4.14), stable in both tails."""
    from scipy import stats

    return 4 * stats.norm.cdf(z) * stats.norm.cdf(-z)


# --------------------------------------------------------------------------- Lemma A.1


def random_model(rng: np.random.Generator, dim: int, correlated: bool = True):
    """Random parameters of the positional-semantic model (A.1-A.2)."""
    m = dim - 1
    if correlated:
        basis = random_orthogonal(rng, 1, m)[0]
        cov = basis @ np.diag(rng.uniform(0.2, 2.0, m)) @ basis.T
    else:
        cov = np.diag(rng.uniform(0.2, 2.0, m))
    return {
        "alpha_pos": rng.normal(0, 1), "beta_pos": rng.uniform(1e-3, 5e-3) * rng.choice([-1, 1]),
        "sigma_pos": rng.uniform(0.5, 2.0), "mu_b": rng.normal(0, 0.5, m), "cov_b": cov,
    }


def check_lemma_a1(dim: int = 16, n_pairs: int = 8, n_draws: int = 200_000, positions=(0.0, 2048.0, 8192.0),
                   correlated: bool = True, tol_z: float = 5.0, misspecify: float = 1.0, seed: int = 0) -> CheckResult:
    """Lemma A.1: under (A.1)-(A.2), ``D = delta^T q_t`` is Gaussian with mean
    ``m(t) = delta_1 (alpha + beta t) + delta_{2:d}^T mu_b`` and variance
    ``v = delta_1^2 sigma_pos^2 + delta_{2:d}^T Sigma_b delta_{2:d}``, the same at every t.

    Simulates the model at several positions and compares sample moments with
    the formulas (z-scores below ``tol_z``), tests normality (Kolmogorov-Smirnov
    on the standardised D), and reports how far eq. 4.12's diagonal variance
    ``delta^T diag(Sigma_b) delta`` is from the true ``v`` when ``Sigma_b`` is
    not diagonal (``correlated=True``): the ratio ``v_diag / v``.

    ``misspecify`` scales the simulated semantic noise away from the model the
    formulas use (1 = the lemma's setting); any other value should fail the
    check, which shows that it has power.
    """
    from scipy import stats

    rng = np.random.default_rng(seed)
    p = random_model(rng, dim, correlated)
    chol = np.linalg.cholesky(p["cov_b"])
    delta = rng.normal(size=(n_pairs, dim))  # [pair, dim]
    v = delta[:, 0] ** 2 * p["sigma_pos"] ** 2 + np.einsum("pi,ij,pj->p", delta[:, 1:], p["cov_b"], delta[:, 1:])
    v_diag = delta[:, 0] ** 2 * p["sigma_pos"] ** 2 + (delta[:, 1:] ** 2 * np.diag(p["cov_b"])).sum(-1)
    rows = []
    for t in positions:
        q1 = p["alpha_pos"] + p["beta_pos"] * t + p["sigma_pos"] * rng.normal(size=n_draws)
        qs = p["mu_b"] + misspecify * rng.normal(size=(n_draws, dim - 1)) @ chol.T
        d = delta[:, :1] * q1 + delta[:, 1:] @ qs.T  # [pair, draw]
        m = delta[:, 0] * (p["alpha_pos"] + p["beta_pos"] * t) + delta[:, 1:] @ p["mu_b"]
        mean_hat, var_hat = d.mean(1), d.var(1, ddof=1)
        ks = np.array([stats.kstest((row - mi) / np.sqrt(vi), "norm").pvalue for row, mi, vi in zip(d, m, v)])
        for i in range(n_pairs):
            rows.append({
                "t": t, "pair": i, "m_formula": m[i], "m_sim": mean_hat[i],
                "z_mean": (mean_hat[i] - m[i]) / np.sqrt(v[i] / n_draws),
                "v_formula": v[i], "v_sim": var_hat[i],
                "z_var": (var_hat[i] - v[i]) / (v[i] * np.sqrt(2 / (n_draws - 1))),
                "ks_pvalue": ks[i], "v_diag_eq412": v_diag[i], "v_diag_over_v": v_diag[i] / v[i],
            })
    table = pd.DataFrame(rows)
    worst = float(np.abs(table[["z_mean", "z_var"]].to_numpy()).max())
    # Bonferroni over all pairs and positions: a true Gaussian fails this rarely.
    ks_ok = bool(table["ks_pvalue"].min() > 1e-3 / len(table))
    passed = worst < tol_z and ks_ok
    ratio = table["v_diag_over_v"]
    summary = (f"max |z| of simulated mean/variance vs formula = {worst:.2f} (tolerance {tol_z}); "
               f"min KS p = {table['ks_pvalue'].min():.3g}; eq. 4.12 diagonal variance / true variance "
               f"ranges {ratio.min():.3f}-{ratio.max():.3f}")
    return CheckResult("Lemma A.1 (Gaussian score difference)", passed, summary, table,
                       {"params": p, "max_abs_z": worst, "v_ratio_min": float(ratio.min()),
                        "v_ratio_max": float(ratio.max())})


# --------------------------------------------------------------------------- Lemma A.2


def sharp_inequality(z=None) -> pd.DataFrame:
    """The terms of the proof of ``4 Phi(z) Phi(-z) <= exp(-z^2/2)`` for every real z, evaluated at ``z``.

    With ``X, Y`` independent standard normals, ``(2 Phi(z) - 1)^2 = P(|X| <= z, |Y| <= z)`` (a square of side
    ``2z``) ``>= P(X^2 + Y^2 <= z^2)`` (the disk inside it) ``= 1 - exp(-z^2/2)`` (``X^2 + Y^2`` is exponential
    with mean 2), and ``4 Phi(z) Phi(-z) = 1 - (2 Phi(z) - 1)^2``; equality only at ``z = 0``. A proof for
    every z, so nothing is checked on a grid; the table shows the two probabilities and the two sides at a
    few points (default: 0, 0.5, ..., 4).
    """
    from scipy import stats

    z = np.arange(0.0, 4.01, 0.5) if z is None else np.abs(np.asarray(z, float))
    square = (2 * stats.norm.cdf(z) - 1) ** 2
    disk = -np.expm1(-z * z / 2)
    return pd.DataFrame({"z": z, "P(square)": square, "P(disk)": disk, "4 Phi(z) Phi(-z)": pp_from_z(z),
                         "exp(-z^2/2)": np.exp(-z * z / 2)})

def lemma_a2_constants(gamma: np.ndarray, z0: np.ndarray, route: str = "sharp"):
    """Explicit ``(C0, T0)`` of Lemma A.2 for slope ``gamma`` and intercept ``z0`` of ``z(t)``.

    ``route="thesis"``: ``C0 = 4/sqrt(2 pi)``, ``T0 = 2 max(|z0|, 1)/|gamma|``;
    ``route="sharp"``: ``C0 = 1``, ``T0 = 2|z0|/|gamma|``.
    """
    gamma, z0 = np.abs(np.asarray(gamma, float)), np.abs(np.asarray(z0, float))
    if route == "thesis":
        return np.full(gamma.shape, C0_MILLS), 2 * np.maximum(z0, 1.0) / gamma
    if route == "sharp":
        return np.ones(gamma.shape), 2 * z0 / gamma
    raise ValueError(f"route must be 'thesis' or 'sharp', got {route!r}")


def check_lemma_a2(n_params: int = 500, n_t: int = 400, route: str = "thesis", t_span: float = 6.0,
                   seed: int = 0) -> CheckResult:
    """Lemma A.2: ``PP(t) <= C0 exp(-gamma^2 t^2 / 8)`` for ``t >= T0``.

    Draws ``n_params`` random ``(gamma, z0)``, evaluates ``PP(t) = 4 Phi(z) Phi(-z)``
    with ``z = gamma t + z0`` on ``n_t`` points of ``[T0, T0 + t_span/|gamma|]``
    and checks the bound with the explicit constants of ``route``. Also
    reports how often the bound fails *before* T0 (on ``[0, T0)``), which shows
    the condition ``t >= T0`` is needed. The inequality ``4 Phi(z) Phi(-z) <= exp(-z^2/2)`` behind the
    sharp route has a proof for every z (:func:`sharp_inequality`).
    """
    rng = np.random.default_rng(seed)
    gamma = rng.lognormal(-6, 1.5, n_params) * rng.choice([-1, 1], n_params)  # per-token slopes of z
    z0 = rng.normal(0, 3, n_params)
    c0, t0 = lemma_a2_constants(gamma, z0, route)
    s = np.linspace(0, 1, n_t)
    t_after = t0[:, None] + s * t_span / np.abs(gamma[:, None])  # [param, t]
    t_before = s[:-1] * t0[:, None]
    def ratio(t):
        pp = pp_from_z(gamma[:, None] * t + z0[:, None])
        bound = c0[:, None] * np.exp(-(gamma[:, None] ** 2) * t**2 / 8)
        return pp / bound
    after, before = ratio(t_after), ratio(t_before)
    table = pd.DataFrame({
        "gamma": gamma, "z0": z0, "C0": c0, "T0": t0,
        "max_ratio_after_T0": after.max(1), "max_ratio_before_T0": np.where(t0 > 0, before.max(1), np.nan),
    })
    n_fail_before = int((table["max_ratio_before_T0"] > 1).sum())
    passed = bool(after.max() <= 1 + 1e-12)
    summary = (f"route {route!r}: max PP/bound over t >= T0 = {after.max():.4f} for {n_params} random (gamma, z0); "
               f"bound violated before T0 for {n_fail_before}/{n_params}")
    return CheckResult("Lemma A.2 (single-pair decay)", passed, summary, table,
                       {"max_ratio": float(after.max()), "n_fail_before_T0": n_fail_before})


# --------------------------------------------------------------------------- Theorem 4.4


def aggregate_bound(delta1: np.ndarray, v: np.ndarray, z0: np.ndarray, beta_pos: float, route: str = "sharp"):
    """Constants of the aggregate bound ``AP_t <= AP_inf + C exp(-c t^2)`` (A.9-A.11).

    ``delta1`` (positional coordinate differences), ``v`` (score variances) and
    ``z0`` (standardised intercepts) describe the key pairs. Pairs with
    ``delta1 == 0`` form S0. Returns ``dict(AP_inf, C, c, T, pi0)``; the bound
    holds for ``t >= T`` (the largest per-pair T0).
    """
    delta1, v, z0 = (np.asarray(a, float) for a in (delta1, v, z0))
    s0 = delta1 == 0
    pi0 = float(s0.mean())
    ap_inf = float(pp_from_z(z0[s0]).sum() / len(delta1)) if s0.any() else 0.0
    d_min = float(np.abs(delta1[~s0]).min())
    c = d_min**2 * beta_pos**2 / (8 * float(v[~s0].max()))
    gamma = delta1[~s0] * beta_pos / np.sqrt(v[~s0])
    c0, t0 = lemma_a2_constants(gamma, z0[~s0], route)
    return {"AP_inf": ap_inf, "C": (1 - pi0) * float(c0.mean()), "c": c, "T": float(t0.max()), "pi0": pi0}


def check_theorem_4_4(dim: int = 16, n_pairs: int = 256, pi0: float = 0.1, n_t: int = 400, route: str = "sharp",
                      seed: int = 0) -> CheckResult:
    """Theorem 4.4: ``AP_t <= AP_inf + C exp(-c t^2)`` with the constants of the aggregate proof.

    Random model parameters and key differences (a share ``pi0`` with
    ``delta_1 = 0``); the exact Gaussian ``AP_t`` (mean pairwise plasticity) is
    compared with the bound on a grid of ``t >= T``. Also reports how small
    ``c`` is: it is set by the smallest ``|delta_1|``, which for real-valued key
    coordinates has no positive lower bound.
    """
    rng = np.random.default_rng(seed)
    p = random_model(rng, dim)
    delta = rng.normal(size=(n_pairs, dim))
    delta[rng.random(n_pairs) < pi0, 0] = 0.0
    v = delta[:, 0] ** 2 * p["sigma_pos"] ** 2 + np.einsum("pi,ij,pj->p", delta[:, 1:], p["cov_b"], delta[:, 1:])
    z0 = (delta[:, 0] * p["alpha_pos"] + delta[:, 1:] @ p["mu_b"]) / np.sqrt(v)
    gamma = delta[:, 0] * p["beta_pos"] / np.sqrt(v)
    b = aggregate_bound(delta[:, 0], v, z0, p["beta_pos"], route)
    scale = 1 / np.sqrt(b["c"])  # the natural t scale of the bound
    t = np.concatenate([np.linspace(0, b["T"], n_t, endpoint=False), b["T"] + np.linspace(0, 4 * scale, n_t)])
    ap = pp_from_z(gamma[:, None] * t + z0[:, None]).mean(0)  # [t]
    bound = b["AP_inf"] + b["C"] * np.exp(-b["c"] * t**2)
    after = t >= b["T"]
    table = pd.DataFrame({"t": t, "AP_t": ap, "bound": bound, "slack": bound - ap, "t_ge_T": after})
    passed = bool((ap[after] <= bound[after] + 1e-12).all())
    b["n_violations_before_T"] = int((ap[~after] > bound[~after]).sum())
    summary = (f"AP_t <= AP_inf + C exp(-c t^2) on {n_t} points of t >= T = {b['T']:.4g}: {passed} "
               f"({b['n_violations_before_T']} of {n_t} points before T violate it); "
               f"AP_inf = {b['AP_inf']:.4f} (pi0 = {b['pi0']:.3f}), C = {b['C']:.3f}, c = {b['c']:.3g}, "
               f"min |delta_1| = {np.abs(delta[delta[:, 0] != 0, 0]).min():.3g}")
    return CheckResult("Theorem 4.4 (aggregate decay)", passed, summary, table, b)


def population_ap(t, sigma_delta: float = 1.0, v: float = 1.0, beta: float = 1.0, alpha: float = 0.0,
                  z0: float = 0.0, n_grid: int = 40_001) -> np.ndarray:
    """Population ``AP_t = E[4 Phi(z) Phi(-z)]`` when ``delta_1 ~ N(0, sigma_delta^2)`` has a density at 0.

    ``z = delta_1 (alpha + beta t)/sqrt(v) + z0`` (Lemma A.1 with the semantic
    part of the mean folded into ``z0``). Substituting ``u = delta_1 (alpha +
    beta t)/sqrt(v)`` turns the expectation into
    ``s(t) int 4 Phi(u + z0) Phi(-u - z0) f(u s(t)) du`` with
    ``s(t) = sqrt(v)/|alpha + beta t|`` and ``f`` the density of ``delta_1``: an
    integrand whose width no longer shrinks with t, so one fixed grid (Simpson,
    ``n_grid`` points on ``|u + z0| <= 12``, where the rest is below
    ``exp(-72)``) serves every t at once. Vectorised over ``t``.

    Returns AP_t with the shape of ``t``.
    """
    from scipy import stats
    from scipy.integrate import simpson

    t = np.asarray(t, float)
    s = math.sqrt(v) / np.abs(alpha + beta * t.ravel())  # [t]
    u = np.linspace(-12.0, 12.0, n_grid) - z0  # [grid]
    pp = pp_from_z(u + z0)  # [grid]
    dens = stats.norm.pdf(u[None, :] * s[:, None], scale=sigma_delta)  # [t, grid]
    return (s * simpson(pp * dens, x=u, axis=-1)).reshape(t.shape)


def population_ap_gaussian(t, sigma_delta: float = 1.0, v: float = 1.0, beta: float = 1.0) -> np.ndarray:
    """Closed form of :func:`population_ap` at ``alpha = z0 = 0``: ``(4/pi) arcsin(1/sqrt(2 (1 + a^2)))``, ``a = sigma_delta beta t/sqrt(v)``.

    With ``X, Y1, Y2`` independent standard normals, ``E[Phi(aX)^2] = Pr[Y1 < aX, Y2 < aX]``, a bivariate
    normal orthant with correlation ``rho = a^2/(1 + a^2)``, so ``E[4 Phi Phi] = 1 - (2/pi) arcsin(rho) =
    (2/pi) arccos(rho)``; ``arccos(rho) = 2 arcsin(sqrt((1 - rho)/2))`` avoids the cancellation near 1.
    For large t it is ``2 sqrt 2 sqrt(v)/(pi sigma_delta |beta| t) (1 + O(t^-2))``.
    """
    a = sigma_delta * beta * np.asarray(t, float) / math.sqrt(v)
    return 4 / math.pi * np.arcsin(1 / np.sqrt(2 * (1 + a * a)))


def population_rate_limit(sigma_delta: float = 1.0, v: float = 1.0, beta: float = 1.0) -> float:
    """``lim t AP_t = f(0) sqrt(v)/|beta| * 4/sqrt(pi)`` with ``f(0) = 1/(sqrt(2 pi) sigma_delta)``.

    It does not depend on ``alpha`` or ``z0``: the integral of ``4 Phi(u) Phi(-u)`` is shift-invariant.
    """
    from scipy import stats

    return stats.norm.pdf(0.0, scale=sigma_delta) * math.sqrt(v) / abs(beta) * PP_INTEGRAL


def check_population_rate(t=None, sigma_delta: float = 1.0, v: float = 1.0, beta: float = 1.0, alpha: float = 0.0,
                          z0: float = 0.0, rtol: float = 1e-3) -> CheckResult:
    """The population ``AP_t`` of Definition 4.3 decays like ``1/t``, not like ``exp(-c t^2)``.

    ``delta_1 ~ N(0, sigma_delta^2)`` (continuous, density ``f(0) > 0``): pairs
    with ``|delta_1| <~ sqrt(v)/(|beta| t)`` stay plastic at every t, and their
    probability is ``~ 2 f(0) sqrt(v)/(|beta| t)``. Evaluates ``t AP_t`` by
    quadrature (:func:`population_ap`) for ``t`` (default 10 ... 10^4) and checks
    it against the limit :func:`population_rate_limit` (relative ``rtol`` at the
    largest t) and, when ``alpha = z0 = 0``, against the closed form
    :func:`population_ap_gaussian` at every t; also the log-log slope of AP_t
    over the last decade, which is -1 for a ``1/t`` law and below -100 for any
    ``exp(-c t^2)`` law that is visible at t = 10.
    """
    t = np.logspace(1, 4, 31) if t is None else np.asarray(t, float)
    ap = population_ap(t, sigma_delta, v, beta, alpha, z0)
    limit = population_rate_limit(sigma_delta, v, beta)
    table = pd.DataFrame({"t": t, "AP_t": ap, "t_AP_t": t * ap, "limit": limit})
    exact = alpha == 0 and z0 == 0
    if exact:
        table["AP_t_closed_form"] = population_ap_gaussian(t, sigma_delta, v, beta)
    last = t >= t.max() / 10
    slope = float(np.polyfit(np.log(t[last]), np.log(ap[last]), 1)[0]) if last.sum() > 1 else float("nan")
    close = abs(t[-1] * ap[-1] / limit - 1) < rtol
    agree = (not exact) or bool(np.allclose(ap, table["AP_t_closed_form"], rtol=1e-8, atol=0))
    passed = bool(close and agree and abs(slope + 1) < 0.01)
    summary = (f"t AP_t = {t[0] * ap[0]:.4f} at t = {t[0]:g}, {t[-1] * ap[-1]:.4f} at t = {t[-1]:g}; limit "
               f"f(0) sqrt(v)/|beta| 4/sqrt(pi) = {limit:.4f}; log-log slope over the last decade {slope:.4f}"
               + ("; quadrature = closed form" if exact and agree else ""))
    return CheckResult("Population AP_t of Definition 4.3 (rate)", passed, summary, table,
                       {"limit": limit, "slope": slope, "t_ap_last": float(t[-1] * ap[-1])})


def prefix_pair_distances(t: int) -> np.ndarray:
    """Probability of each distance ``d = j - i`` (``d = 1 .. t-2``) between the two keys of a pair drawn as
    Definition 4.3 draws it for a query at position ``t``: prefix length ``N`` uniform on ``{2, ..., t-1}``,
    then a pair uniform among the ``C(N, 2)`` pairs of the prefix.

    A pair with later key ``j`` has probability ``(2/(t-2)) (1/(j-1) - 1/(t-1))``, the same for each of its
    ``j - 1`` earlier keys, so ``P(d) = (2/(t-2)) sum_{j=d+1}^{t-1} (1/(j-1) - 1/(t-1))``.
    """
    t = int(t)
    j = np.arange(2, t)  # later key positions 2 .. t-1
    w = 2.0 / (t - 2) * (1.0 / (j - 1) - 1.0 / (t - 1))  # [j] probability of each pair with later key j
    tail = np.cumsum(w[::-1])[::-1]  # sum over j >= this j
    return tail  # P(d) for d = 1 .. t-2: the later key j = d + 1 .. t - 1 (one pair per j)


def normal_pdf(x: np.ndarray, loc, scale: float) -> np.ndarray:
    """``scipy.stats.norm.pdf(x, loc, scale)`` for a positive scalar ``scale`` and finite ``x``, ``loc``: the same
    operations in the same order (``exp(-z**2/2) / sqrt(2 pi) / scale``, ``z = (x - loc) / scale``), so the same
    values bit for bit, without the argument checks and masked copies that took two thirds of
    :func:`population_ap_prefix_drift`'s time."""
    z = (np.asarray(x, np.float64) - loc) / scale
    return np.exp(-z**2 / 2.0) / np.sqrt(2 * np.pi) / scale


def population_ap_prefix_drift(t, key_drift: float = 1.0, sigma_delta: float = 1.0, v: float = 1.0,
                               beta: float = 1.0, n_grid: int = 4001) -> np.ndarray:
    """Population ``AP_t`` of Definition 4.3 when the keys drift: ``delta_1 = key_drift d + sigma_delta eps``.

    The pair's distance ``d`` follows :func:`prefix_pair_distances` (it spreads over ``1 .. t-2`` as t grows),
    and ``z = delta_1 beta t / sqrt(v)`` (Lemma A.1 with ``alpha = z0 = 0``). For each d the expectation over
    ``eps`` uses the substitution of :func:`population_ap`. Only pairs with ``|delta_1| <~ sqrt(v)/(beta t)``
    stay plastic, which needs ``eps`` near ``-key_drift d / sigma_delta``: the pair law moves with t, and
    ``AP_t`` falls like ``log t / t^2`` instead of the ``1/t`` of a fixed law.
    """
    from scipy import stats
    from scipy.integrate import simpson

    out = []
    u = np.linspace(-12.0, 12.0, n_grid)  # [grid]
    pp = pp_from_z(u)
    for tt in np.atleast_1d(np.asarray(t, int)):
        pd_ = prefix_pair_distances(tt)  # [d]
        d = np.arange(1, len(pd_) + 1)
        s = math.sqrt(v) / (beta * tt)  # delta_1 = u s
        # distances whose mean drift sits more than 40 noise sd beyond the grid's reach add under
        # phi(40) ~ 1e-348 (0 in float64): leaving them out keeps the cost flat in t instead of linear
        near = np.abs(key_drift) * d - 12.0 * s <= 40.0 * sigma_delta
        dens = normal_pdf(u[None, :] * s, key_drift * d[near, None], sigma_delta)  # [d, grid]
        out.append(float((pd_[near] * s * simpson(pp * dens, x=u, axis=-1)).sum()))
    return np.asarray(out).reshape(np.shape(t))


def rate_forms(t, ap) -> dict:
    """Least-squares fits of two decay laws to ``log AP_t``, each with two free parameters.

    * power law ``AP_t = A t^b`` (``b`` free: ``t^-1.7``, ``t^-2`` and every other pure power);
    * log law ``AP_t = K (log t - c) / t^2`` (``K`` and ``c < log min t`` free), the form of ``log t / t^2``
      with its constant: under the prefix law ``t^2 AP_t`` grows linearly in ``log t`` (see
      :func:`check_population_rate_drifting`).

    The power law is an ordinary regression of ``log AP_t`` on ``log t``; for the log law ``log K`` is the mean
    residual at each ``c`` and ``c`` minimises the residual sum of squares (bounded to ``[-100, log min t)``; at
    ``c -> -inf`` the log law becomes ``t^-2``). Both fits have the same number of parameters, so their root
    mean square residuals compare directly.

    Returns
    -------
    dict
        ``slope``, ``rms_power``, ``K``, ``c``, ``rms_log`` and ``preference`` = ``rms_power / rms_log``
        (large: the data prefer ``log t / t^2``; below 1: a pure power fits better), and the two fits
        ``fit_power``, ``fit_log`` on ``t``.
    """
    from scipy import optimize

    t, ap = np.asarray(t, float), np.asarray(ap, float)
    if t.shape != ap.shape or t.size < 4 or (t <= 1).any() or (ap <= 0).any() or not np.isfinite(ap).all():
        raise ValueError("rate_forms needs at least 4 positions t > 1 with finite AP_t > 0 of the same shape")
    x, y = np.log(t), np.log(ap)
    design = np.column_stack([np.ones_like(x), x])
    coef = np.linalg.lstsq(design, y, rcond=None)[0]
    r_power = y - design @ coef

    def residual(c):
        r = y + 2 * x - np.log(x - c)
        return r - r.mean(), r.mean()

    c = optimize.minimize_scalar(lambda c: float(np.sum(residual(c)[0] ** 2)), bounds=(-100.0, x.min() - 1e-9),
                                 method="bounded", options={"xatol": 1e-10}).x
    r_log, log_k = residual(c)
    rms_power, rms_log = (float(np.sqrt(np.mean(r * r))) for r in (r_power, r_log))
    return {"slope": float(coef[1]), "rms_power": rms_power, "K": float(np.exp(log_k)), "c": float(c),
            "rms_log": rms_log, "preference": rms_power / rms_log if rms_log > 0 else float("inf"),
            "fit_power": np.exp(design @ coef), "fit_log": np.exp(log_k) * (x - c) / t**2}


def check_rate_form(t, ap, margin: float = 10.0, name: str = "AP_t falls like log t / t^2") -> CheckResult:
    """Whether ``AP_t`` on ``t`` follows ``log t / t^2`` rather than any pure power ``t^b``.

    Fits both laws (:func:`rate_forms`) and passes when the log law's root mean square residual of ``log AP_t``
    is at least ``margin`` times smaller than the power law's. A pure power (``t^-1.7``, ``t^-2``) fails: the
    power law fits it exactly. ``log t / t^2`` passes when ``t`` spans enough decades for the log factor to bend
    the log-log line (over one decade a power ``t^-1.8`` is within a few percent of it).
    """
    f = rate_forms(t, ap)
    t = np.asarray(t, float)
    # the ratios to each fit show the shape: a pure power's bows across the range when the log factor is there
    table = pd.DataFrame({"t": t, "AP_t": ap, "AP_t / power law": ap / f["fit_power"], "AP_t / log law": ap / f["fit_log"]})
    passed = bool(f["preference"] >= margin)
    summary = (f"over t = {t.min():g} .. {t.max():g}: log law K (log t - c)/t^2 with K = {f['K']:.4g}, c = {f['c']:.3f} "
               f"leaves an rms log residual of {f['rms_log']:.2e}; the best pure power t^{f['slope']:.3f} leaves "
               f"{f['rms_power']:.2e}, {f['preference']:.3g} times as much (the check asks for at least {margin:g})")
    return CheckResult(name, passed, summary, table,
                       {k: v for k, v in f.items() if not k.startswith("fit_")} | {"margin": margin})


def check_population_rate_drifting(t=None, key_drift: float = 0.05, sigma_delta: float = 1.0, t_fit: float = 300.0,
                                   margin: float = 10.0) -> CheckResult:
    """Under Definition 4.3 with drifting keys, ``AP_t`` is of order ``log t / t^2``, neither ``1/t`` nor a pure power.

    Why the log: for large t only pairs with ``|delta_1| <~ sqrt(v)/(beta t)`` stay plastic, so ``AP_t ~ (C/t)
    sum_d P_t(d) f_d(0)`` with ``f_d`` the density of ``delta_1`` for keys ``d`` tokens apart, which the drift
    makes negligible beyond ``d ~ sigma_delta/key_drift``; under the prefix law ``P_t(d) ~ (2/t)(log t - log d - 1)``
    for fixed ``d``, hence ``t^2 AP_t ~ K (log t - c)`` with ``c = 1 + the f_d(0)-weighted mean of log d``.

    Evaluates ``AP_t`` (:func:`population_ap_prefix_drift`) for ``t`` (default 25 values from 30 to 10^5) and, on
    ``t >= t_fit`` (past the ``O(1/t)`` corrections of the asymptotics), compares that law with the best pure
    power (:func:`check_rate_form`): it passes when the log law's rms residual of ``log AP_t`` is at least
    ``margin`` times smaller, and ``t AP_t`` has fallen below a fifth of its first value (not ``1/t``).
    """
    t = np.unique(np.logspace(np.log10(30), 5, 25).astype(int)) if t is None else np.asarray(t, int)
    ap = population_ap_prefix_drift(t, key_drift, sigma_delta)
    fitted = t >= t_fit
    form = check_rate_form(t[fitted], ap[fitted], margin)
    table = pd.DataFrame({"t": t, "AP_t": ap, "t_AP_t": t * ap, "t2_AP_t": t * t * ap, "fitted": fitted})
    for col in ("AP_t / power law", "AP_t / log law"):
        table.loc[fitted, col] = form.table[col].to_numpy()
    falls = bool(table.t_AP_t.iloc[-1] < 0.2 * table.t_AP_t.iloc[0])
    summary = (f"keys drifting by {key_drift:g} per token (noise sd {sigma_delta:g}): t AP_t falls from "
               f"{table.t_AP_t.iloc[0]:.3g} at t = {t[0]} to {table.t_AP_t.iloc[-1]:.3g} at t = {t[-1]}; "
               + form.summary)
    return CheckResult("Population AP_t of Definition 4.3 with drifting keys (rate)", bool(form.passed and falls),
                       summary, table, form.details | {"t_fit": t_fit})


def aggregate_bound_for_heads(stats, metrics=None, route: str = "sharp") -> pd.DataFrame:
    """Theorem 4.4's constants for real heads, from :func:`qkplast.analysis.plasticity.pair_statistics`.

    All valid pairs of all query buckets of a head enter one bound (the proof
    treats the pair set as fixed). Returns per head: ``pi0``, ``AP_inf``, ``C``,
    ``c``, ``T`` (where the bound starts), ``T / seq_len``, the bound at the end
    of the window, and, when ``metrics`` is given, the measured plasticity of
    the last query bucket.
    """
    rows = []
    for h in range(stats.sizes["head"]):
        s = stats.isel(head=h)
        ok = s.valid.values
        var = s[{"diagonal": "v_diag", "full": "v_full", "joint": "v_joint"}[stats.attrs["options"]["covariance"]]]
        b = aggregate_bound(s.delta1.values[ok], var.values[ok], s.z0.values[ok], float(s.beta_pos), route)
        end = float(stats.tau.max())
        row = {"layer": int(s.layer), "q_head": int(s.q_head), **b, "T_over_window": b["T"] / end,
               "bound_at_window_end": b["AP_inf"] + b["C"] * math.exp(-b["c"] * end**2),
               "min_abs_delta1": float(np.abs(s.delta1.values[ok]).min())}
        if metrics is not None:
            row["measured_AP_last_bucket"] = float(metrics.ap.sel(head=h).isel(query_bucket=-1))
        rows.append(row)
    return pd.DataFrame(rows)


def bound_start_summary(bounds: pd.DataFrame) -> dict:
    """Where the bound of :func:`aggregate_bound_for_heads` starts over heads, at the precision a capture supports.

    Each head's ``T`` rests on its smallest ``|delta_1|``, a near-cancellation that float rounding in the
    capture moves by several percent between machines (the largest ``T`` of the default run: 367,814 on one,
    403,709 on another). So: ``median`` of ``T_over_window`` to two significant digits, and the powers of ten
    that bracket every head, ``10**lo_exp <= T_over_window <= 10**hi_exp``.
    """
    t = bounds["T_over_window"].to_numpy(float)
    if t.size == 0 or not np.isfinite(t).all() or (t <= 0).any():
        raise ValueError("bound_start_summary needs finite, positive T_over_window for at least one head")
    return {"median": float(f"{np.median(t):.2g}"), "lo_exp": int(np.floor(np.log10(t.min()))),
            "hi_exp": int(np.ceil(np.log10(t.max())))}


# --------------------------------------------------------------------------- diagnostics on captured heads


def rotate_capture(capture, rotation: np.ndarray):
    """The capture with every head's queries and keys turned by the orthogonal matrix ``rotation``.

    All dot products ``q^T k`` are unchanged, so any basis-free analysis must
    give the same result on both.
    """
    r = np.asarray(rotation, float)
    return capture.assign(q=(capture.q.dims, capture.q.values @ r.T), k=(capture.k.dims, capture.k.values @ r.T))


def basis_dependence(capture, seed: int = 0, covariances=("diagonal", "full"), heads=None, **options) -> pd.DataFrame:
    """How much plasticity changes when Q and K are turned by one random orthogonal matrix.

    A quantity that depends on q^T k only must not move. Returns, per
    covariance option, the largest and mean absolute change of ``ap`` and the
    change of the mean ``ap_drop``. ``heads`` (positions along ``head``) limits the work.
    """
    import warnings

    from qkplast.analysis.plasticity import PlasticityWarning, plasticity

    if heads is not None:
        capture = capture.isel(head=np.atleast_1d(np.arange(capture.sizes["head"])[heads]))
    r = random_orthogonal(np.random.default_rng(seed), 1, capture.sizes["dim"])[0]
    moved = rotate_capture(capture, r)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        for cov in covariances:
            # the closed form alone: its ap is the same with or without the Monte Carlo values, which are most of the work
            a = plasticity(capture, covariance=cov, seed=seed, monte_carlo=False, **options)
            b = plasticity(moved, covariance=cov, seed=seed, monte_carlo=False, **options)
            d = np.abs(a.ap.values - b.ap.values)
            rows.append({"covariance": cov, "max_abs_change_ap": float(np.nanmax(d)),
                         "mean_abs_change_ap": float(np.nanmean(d)),
                         "change_mean_ap_drop": float(b.ap_drop.mean() - a.ap_drop.mean())})
    return pd.DataFrame(rows).set_index("covariance")


def variance_across_buckets(capture, heads=None, **options) -> pd.DataFrame:
    """Lemma A.1 calls v independent of t, but v uses the statistics of the query's bucket.

    The key pairs of the last query bucket are held fixed and their variance
    ``v`` (options' covariance) is evaluated with the statistics of every query
    bucket that has queries; per head, the median over pairs of ``max_b v / min_b v``.
    """
    import torch

    from qkplast.tensors import as_f64, resolve_device
    from qkplast.analysis.linalg import householder_apply, householder_vector
    from qkplast.analysis.vectors import analysis_vectors
    from qkplast.options import AnalysisOptions
    from qkplast.analysis.pairs import pair_plan
    from qkplast.analysis.plasticity import query_model
    from qkplast.analysis.moments import slope

    opt = AnalysisOptions.from_kwargs(None, **options)
    capture = analysis_vectors(capture, opt)
    dev = resolve_device(opt.device)
    sub = capture if heads is None else capture.isel(head=np.atleast_1d(np.arange(capture.sizes["head"])[heads]))
    lay = pair_plan(sub, opt, dev, warn=False)
    q, k = as_f64(sub["q"], dev), as_f64(sub["k"], dev)
    u = householder_vector(slope(q, lay.t))
    qr, kr = householder_apply(u, q), householder_apply(u, k)
    model = query_model(qr, lay.t, lay.onehot, lay.tau, opt)
    last = lay.pvalid[-1]
    delta = kr[:, lay.pi[-1][last]] - kr[:, lay.pj[-1][last]]  # [head, pair, dim]
    if model.full:
        v = torch.einsum("hpd,hbde,hpe->hbp", delta, model.cov, delta)
    else:
        v = torch.einsum("hpd,hbd->hbp", delta * delta, model.cov)
    has_queries = torch.as_tensor(lay.counts >= opt.min_bucket_samples, device=dev)
    v = v[:, has_queries]
    spread = (v.amax(1) / v.amin(1)).median(-1).values.cpu().numpy()
    return pd.DataFrame({"layer": sub.layer.values, "q_head": sub.q_head.values, "median_max_over_min_v": spread})

