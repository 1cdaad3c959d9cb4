"""The decision rule: verdict words computed from the numbers (an estimate, its interval, its adjusted p-value
or its permutation null), Holm's correction across a chapter's readings (:func:`holm`; a page's readings decided
together: :func:`holm_verdicts`), conjunctions of claims, and whether a measured coverage meets the policy's
target (:func:`coverage_verdict`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from qkplast.stats.intervals import COVERAGE_TARGET


def null_verdict(observed: float, null, alternative: str = "greater", alpha: float = 0.05,
                 null_name: str = "null") -> dict:
    """Whether an observed statistic beats its null distribution, with the wording computed from it.

    ``null`` holds the statistic on ``n`` replicates of a null (e.g. permutations). The
    permutation p-value is ``(1 + #{null >= observed}) / (1 + n)`` (``"greater"``; ``"less"``
    mirrors it), which is exact for exchangeable replicates. ``word`` is ``"confirmed"`` when
    ``p < alpha`` and ``"not distinguishable from the null"`` otherwise (one reading alone; a page with
    several corrects across them, :func:`holm`); ``text`` states the observed value, the null's 5-95% range
    and the p-value in one line, without a word.
    """
    null = np.asarray(null, float).ravel()
    if null.size == 0:
        raise ValueError("the null distribution is empty: run at least one null replicate")
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    finite = null[np.isfinite(null)]
    if finite.size == 0 or not np.isfinite(observed):
        # e.g. a spread log(q95 / q05) over ratios that are not all positive on a tiny capture: no reading
        # can be made, which is said (p NaN, Holm leaves it out), never hidden
        return {"observed": float(observed), "null_lo": np.nan, "null_hi": np.nan, "p": np.nan,
                "n_null": int(finite.size), "confirmed": False, "word": "left open",
                "text": (f"observed {observed:.3g}; {null_name}: {finite.size} of {null.size} replicates finite; the "
                         "statistic is undefined on this capture, so no p-value (left open)")}
    null = finite
    hits = (null >= observed) if alternative == "greater" else (null <= observed)
    p = (1 + int(hits.sum())) / (1 + null.size)
    word = "confirmed" if p < alpha else "not distinguishable from the null"
    lo, hi = np.percentile(null, [5, 95])
    text = (f"observed {observed:.3g}; {null_name} ({null.size} replicates) 5-95% {lo:.3g}-{hi:.3g}; "
            f"permutation p = {p:.3g} ({alternative}, before any correction across readings)")
    return {"observed": float(observed), "null_lo": float(lo), "null_hi": float(hi), "p": p,
            "n_null": int(null.size), "confirmed": p < alpha, "word": word, "text": text}


#: The verdict words, in the order a conjunction ranks them.
WORDS = ("supported", "contradicted", "no effect", "left open")
#: The word of a reading whose model failed a gate (distinct from "left open": nothing was there to decide).
NOT_TESTABLE = "not testable"
CLAIMS = ("greater", "less", "differs", "equivalent")


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment of ``m`` p-values (family-wise error control, any dependence).

    The ``i``-th smallest p-value is multiplied by ``m - i`` (``i`` from 0), a running maximum keeps the
    adjusted values monotone in the original order of significance, and values are capped at 1. NaN
    entries (readings that could not be made) are left NaN and do not count in ``m``.

    Returns
    -------
    numpy.ndarray
        Adjusted p-values, in the input's order and shape.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    flat = p.ravel()
    ok = np.flatnonzero(np.isfinite(flat))
    out = np.full_like(flat, np.nan)
    if ok.size:
        order = ok[np.argsort(flat[ok], kind="stable")]
        scaled = flat[order] * (ok.size - np.arange(ok.size))  # [m]: p_(i) (m - i)
        out[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return out.reshape(p.shape)


def verdict(estimate: float, lo: float, hi: float, p: float | None = None, *, claim: str = "greater",
            margin: float | None = None, alpha: float = 0.05) -> str:
    """The verdict word of one reading: a contrast, its interval and (optionally) its adjusted p-value.

    Parameters
    ----------
    estimate, lo, hi : float
        The contrast (e.g. an effect minus its baseline) and the end points of the interval the inference
        policy reports for it (documents or seeds as the unit).
    p : float, optional
        The reading's two-sided p-value *after* the chapter's multiplicity correction (:func:`holm` across
        its readings). None when the chapter makes this one reading only; then the interval decides alone.
    claim : {"greater", "less", "differs", "equivalent"}
        What the chapter predicted: the contrast is above zero, below zero, away from zero on either side
        (``p`` then two-sided), or within ``margin`` of zero.
    margin : float, optional
        An equivalence margin stated before the data: an interval inside ``(-margin, margin)`` is a tight
        null. Required for ``claim="equivalent"``.
    alpha : float
        Level of the adjusted p-value (0.05).

    Returns
    -------
    str
        ``"supported"``: the interval excludes zero on the claimed side and ``p < alpha`` (or, for an
        equivalence claim, the interval lies inside the margin); ``"contradicted"``: the interval excludes
        zero on the other side with ``p < alpha`` (for an equivalence claim: on either side, outside the
        margin); ``"no effect"``: a directional claim whose interval lies inside the margin;
        ``"left open"``: anything else, a NaN interval included.
    """
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {CLAIMS}, got {claim!r}")
    if claim == "equivalent" and margin is None:
        raise ValueError("claim='equivalent' needs the equivalence margin stated in advance (margin=...)")
    if margin is not None and not margin > 0:
        raise ValueError(f"margin must be positive, got {margin}")
    if not (np.isfinite(lo) and np.isfinite(hi) and np.isfinite(estimate)):
        return "left open"
    if lo > hi:
        raise ValueError(f"interval end points out of order: lo={lo} > hi={hi}")
    inside = margin is not None and -margin < lo and hi < margin
    significant = p is None or (np.isfinite(p) and p < alpha)
    if claim == "equivalent":
        if inside:
            return "supported"
        outside = margin is not None and (lo >= margin or hi <= -margin)
        return "contradicted" if outside and significant else "left open"
    if inside:  # the whole interval within the margin stated in advance: no effect worth the name, whatever its sign
        return "no effect"
    above, below = lo > 0, hi < 0
    if claim == "differs":
        return "supported" if (above or below) and significant else "left open"
    if (above if claim == "greater" else below) and significant:
        return "supported"
    if (below if claim == "greater" else above) and significant:
        return "contradicted"
    return "no effect" if inside else "left open"


def conjunction(words) -> str:
    """The verdict on a claim made of several parts: supported only when every part is.

    A contradicted part contradicts the whole; otherwise a part that is not testable (its model failed a gate:
    ``"not testable (gate: a, b)"``, :func:`not_testable`) makes the whole not testable, naming
    every failed gate once; all parts "no effect" is "no effect"; otherwise the claim is left open.
    """
    words = list(words)
    untestable = [w for w in words if w.startswith(NOT_TESTABLE)]
    unknown = sorted(set(words) - set(WORDS) - set(untestable))
    if unknown or not words:
        raise ValueError(f"conjunction needs verdict words from {WORDS} or {NOT_TESTABLE!r}, got {words}")
    if all(w == "supported" for w in words):
        return "supported"
    if "contradicted" in words:
        return "contradicted"
    if untestable:
        gates = [g.strip() for w in untestable for g in w.partition("gate:")[2].rstrip(")").split(",") if g.strip()]
        return f"{NOT_TESTABLE} (gate: {', '.join(dict.fromkeys(gates))})" if gates else NOT_TESTABLE
    if all(w == "no effect" for w in words):
        return "no effect"
    return "left open"


def holm_verdicts(readings: list[dict], alpha: float = 0.05) -> pd.DataFrame:
    """The verdicts of a page's readings, decided together with Holm's correction (the corrections page's rule).

    A reading is "confirmed" when its Holm-adjusted p (:func:`holm` across the readings) is below ``alpha`` and,
    where it has an interval, the interval lies on the claimed side of zero (:func:`verdict`); "contradicted" when
    the interval lies on the other side with the adjusted p below ``alpha``; otherwise "not distinguishable from
    the null" (no interval) or "left open" (an interval that does not decide, or that is undefined: NaN ends; or a
    p that is undefined on this capture, which Holm leaves out of ``m``).

    Parameters
    ----------
    readings : list of dict
        Each with ``item`` and ``p`` (its permutation or t p-value) and, when the item has a contrast with an
        interval over documents, ``estimate``, ``lo``, ``hi`` and ``claim`` (:func:`verdict`'s claims).
    alpha : float
        Level of the adjusted p-values.

    Returns
    -------
    pandas.DataFrame
        One row per item: the readings' columns, ``p (Holm)`` and ``verdict``; ``attrs["rule"]`` states the rule.
    """
    out = pd.DataFrame(readings).set_index("item")
    out["p (Holm)"] = holm(out["p"].to_numpy())
    has_interval = ["lo" in r for r in readings]  # an item with a contrast over documents, defined or not
    words = []
    for (_, r), interval in zip(out.iterrows(), has_interval):
        if not np.isfinite(r["p"]):
            words.append("left open")  # the statistic is undefined on this capture (null_verdict)
        elif interval and not (np.isfinite(r["lo"]) and np.isfinite(r["hi"])):
            words.append("left open")  # its interval is undefined (too few effective documents): p alone decides nothing
        elif interval:
            w = verdict(r.estimate, r.lo, r.hi, r["p (Holm)"], claim=r.claim, alpha=alpha)
            words.append({"supported": "confirmed"}.get(w, w))
        else:
            words.append("confirmed" if r["p (Holm)"] < alpha else "not distinguishable from the null")
    out["verdict"] = words
    out.attrs["rule"] = (f"Holm across {len(out)} readings at {alpha}; an interval over documents, where the item has "
                         "one, must lie on the claimed side of zero")
    return out


def not_testable(failed) -> str:
    """The verdict of a reading on data that failed the gates ``failed`` (their names): ``not testable (gate: a, b)``."""
    return f"{NOT_TESTABLE} (gate: {', '.join(failed)})"


def decide_family(rows: list[dict], alpha: float = 0.05, power: float = 0.8) -> list[dict]:
    """Verdicts of pre-registered readings decided together: Holm across the directional ones that passed their gates.

    Each row holds ``estimate``, ``lo``, ``hi``, ``p`` (the interval's), ``seeds`` (the independent units),
    ``sd`` (their standard deviation of the contrast), ``claim`` (``"greater"``, ``"less"``, ``"equivalent"`` or
    None: exploratory), ``margin`` and ``failed`` (the gates its data failed). Added to each row: ``p_holm``
    (Holm's adjusted p within the family: directional readings with no failed gate), ``holm_level`` (the level
    Holm's step-down tests it at, ``alpha / (m - i)`` for the ``i``-th smallest of ``m`` finite p-values),
    ``detectable`` (the smallest mean contrast the t test over its units detects with probability ``power`` at that
    level, :func:`qkplast.stats.power.detectable_effect` times ``sd``) and ``verdict`` (:func:`verdict`; an
    equivalence reading by its interval against its margin; :func:`not_testable` for a reading with failed gates;
    empty for an exploratory one). Returns the rows.
    """
    from qkplast.stats.power import detectable_effect

    family = [i for i, r in enumerate(rows) if r["claim"] in ("greater", "less") and not r["failed"]]
    adjusted = holm([rows[i]["p"] for i in family])
    finite = [i for i in family if np.isfinite(rows[i]["p"])]
    rank = {i: k for k, i in enumerate(sorted(finite, key=lambda i: rows[i]["p"]))}  # stable: ties keep their order
    for i, row in enumerate(rows):
        row["p_holm"] = float(adjusted[family.index(i)]) if i in family else np.nan
        row["holm_level"] = alpha / (len(finite) - rank[i]) if i in rank else np.nan
        row["detectable"] = (detectable_effect(row["seeds"], row["holm_level"], power) * row["sd"]
                             if i in rank and row["seeds"] >= 2 else np.nan)
        claim, margin = row["claim"], row["margin"]
        if row["failed"]:
            row["verdict"] = not_testable(row["failed"])
        else:
            row["verdict"] = "" if claim is None else verdict(
                row["estimate"], row["lo"], row["hi"], None if claim == "equivalent" else row["p_holm"], claim=claim,
                margin=margin, alpha=alpha)
    return rows


def rejects(p: float, alpha: float = 0.05) -> bool:
    """Whether a two-sided p-value rejects its hypothesis at level ``alpha`` (``p < alpha``; NaN never rejects).

    The one place a page's "consistent with" / "unlikely under" reading of a single test gets its threshold.
    """
    return bool(np.isfinite(p) and p < alpha)


def coverage_verdict(coverage: float, se: float, target: float | None = None) -> str:
    """Whether a measured coverage meets the coverage target of the inference policy.

    Parameters
    ----------
    coverage : float
        The lowest coverage measured (a share of planted replicates whose interval held the true value).
    se : float
        Its binomial standard error.
    target : float, optional
        The target; :data:`qkplast.stats.intervals.COVERAGE_TARGET` by default.

    Returns
    -------
    str
        ``"met"`` at or above the target; ``"not met, within two standard errors of it"`` below it by at most
        two standard errors (the benchmark's replicates cannot tell it from the target); ``"not met"`` otherwise.
    """
    target = COVERAGE_TARGET if target is None else target
    if coverage >= target:
        return "met"
    return "not met, within two standard errors of it" if coverage + 2 * se >= target else "not met"
