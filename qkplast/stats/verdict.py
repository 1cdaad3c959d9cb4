"""Verdict words computed from the numbers: an observed statistic against its permutation null."""

from __future__ import annotations

import numpy as np


def null_verdict(observed: float, null, alternative: str = "greater", alpha: float = 0.05,
                 null_name: str = "null") -> dict:
    """Whether an observed statistic beats its null distribution, with the wording computed from it.

    ``null`` holds the statistic on ``n`` replicates of a null (e.g. permutations). The
    permutation p-value is ``(1 + #{null >= observed}) / (1 + n)`` (``"greater"``; ``"less"``
    mirrors it), which is exact for exchangeable replicates. ``word`` is ``"confirmed"`` when
    ``p < alpha`` and ``"not distinguishable from the null"`` otherwise; ``text`` states the
    observed value, the null's 5-95% range and the p-value in one line.
    """
    null = np.asarray(null, float)
    null = null[np.isfinite(null)]
    if null.size == 0:
        raise ValueError("the null distribution is empty: run at least one null replicate")
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    hits = (null >= observed) if alternative == "greater" else (null <= observed)
    p = (1 + int(hits.sum())) / (1 + null.size)
    word = "confirmed" if p < alpha else "not distinguishable from the null"
    lo, hi = np.percentile(null, [5, 95])
    text = (f"observed {observed:.3g}; {null_name} ({null.size} replicates) 5-95% {lo:.3g}-{hi:.3g}; "
            f"permutation p = {p:.3g} ({alternative}): {word}")
    return {"observed": float(observed), "null_lo": float(lo), "null_hi": float(hi), "p": p,
            "n_null": int(null.size), "confirmed": p < alpha, "word": word, "text": text}
