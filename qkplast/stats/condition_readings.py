"""Readings of the content-decay conditions (thesis 7.6): intervals of each condition and of its difference to the
baseline, the rank of each difference among the reseeded baselines' (the null of no intervention), Holm across the
conditions, the verdict, and the section's mechanism reading.

The captures come from :func:`qkplast.experiments.condition_captures.capture_conditions` and the null from
:func:`qkplast.experiments.condition_captures.reseed_null`. Intervals: every condition's difference to the baseline is
paired by document (the conditions share their documents), and its interval is the inference policy's over
documents (the bias-corrected jackknife-t, below 8 documents with the corrected estimate's own standard error) with
both captures re-analysed whole with each document, and each pair of documents, left out (:func:`condition_table`).
Each condition's difference is ranked among the reseeded differences (:func:`read_conditions`), with Holm's
correction across the conditions, for the part the page decides; the other parts are described beside the same null
without a verdict (:func:`describe_conditions`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from qkplast.analysis.decompose import TERMS, ModelLevelTerms
from qkplast.options import AnalysisOptions
from qkplast.provenance import product_provenance
from qkplast.stats.bootstrap import INTERVAL_NAMES, document_replicates
from qkplast.stats.decision import holm, verdict
from qkplast.stats.intervals import needs_leave_two_out, policy_interval
from qkplast.tensors import resolve_device

__all__ = ["QUANTITIES", "condition_replicates", "condition_table", "read_conditions", "describe_conditions", "mechanism_reading",
           "ROPE_LIKE", "SINK_LIKE"]

#: The quantities of every condition's table: AP_drop and its four parts (:mod:`qkplast.analysis.decompose`).
QUANTITIES = ("ap_drop",) + TERMS
#: the parts of qkplast the jackknife values are computed by (their code's digest is in the kept product's key)
REPLICATES_CODE = ("analysis", "stats", "tensors.py", "options.py")


def condition_replicates(capture: xr.Dataset, options: AnalysisOptions | None = None, store=None,
                         name: str = "condition") -> dict:
    """AP_drop and its parts of one condition's capture, whole and with each document (below 8 documents also each
    pair of documents) left out: the values :func:`condition_table` builds its intervals from.

    The left-out captures keep their share of the whole capture's key pairs and are analysed in one batch
    (:class:`qkplast.analysis.decompose.ModelLevelTerms`, :func:`qkplast.stats.bootstrap.document_replicates`).
    ``store`` (``store(stem, key, compute)``, :func:`qkplast.rundir.product_store`) keeps them under
    ``conditions/jackknife-<name>``, keyed by the capture's content (:func:`qkplast.provenance.content_digest`),
    the options and the code (:func:`qkplast.provenance.product_provenance`), and reads them back.

    Returns
    -------
    dict
        ``point`` ``[quantity]``, ``jackknife`` ``[document, quantity]`` and ``jackknife2`` ``[document pair,
        quantity]`` (:func:`qkplast.stats.intervals.leave_two_out` order) or None.
    """
    opt = options or AnalysisOptions()
    key = {"statistic": "model_level_terms", "quantities": list(QUANTITIES), "options": opt.result_key(),
           "provenance": product_provenance(*REPLICATES_CODE, device=str(resolve_device(opt.device)))}
    return document_replicates(capture, ModelLevelTerms(opt), pairs_of=opt, store=store,
                               stem=f"conditions/jackknife-{name}", key=key)


def condition_table(captures: dict[str, xr.Dataset], options: AnalysisOptions | None = None, level: float = 0.95,
                    progress: bool = False, *, store=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """AP_drop and its four parts per condition, and each condition's paired difference to ``baseline``.

    Returns two long tables (condition, quantity, estimate, lo, hi): each condition's model-level means
    over heads with the policy's interval over documents (:func:`qkplast.stats.intervals.policy_interval`), and
    the differences to the baseline with the same interval of the paired difference (each document, and below 8
    documents each pair, left out of both captures, both re-analysed whole) and its two-sided t p-value. The capture at every position is left out (it is
    the null's source, not a condition).
    """
    from qkplast.progress import progress_bar

    if "baseline" not in captures:
        raise ValueError("condition_table needs a 'baseline' condition")
    captures = {n: c for n, c in captures.items() if n != "all_positions"}
    docs = {name: tuple(np.unique(c.doc.values)) for name, c in captures.items()}
    if len(set(docs.values())) != 1:
        raise ValueError(f"conditions hold different documents {sorted(set(docs.values()))}: the differences are paired "
                         "by document")
    doc_ids = docs["baseline"]
    opt = options or AnalysisOptions()
    two = needs_leave_two_out(len(doc_ids))
    est, jack, jack2 = {}, {}, {}
    for name, cap in progress_bar(captures.items(), desc="conditions", enabled=progress):
        kept = condition_replicates(cap, opt, store, name)  # each left-out capture keeping its share of pairs
        est[name], jack[name], jack2[name] = kept["point"], kept["jackknife"], kept["jackknife2"]  # [(doc, )quantity]
    rows, diffs = [], []
    for name in captures:
        own = policy_interval(est[name], jack[name], jack2[name], level)
        rows += [{"condition": name, "quantity": q, "estimate": est[name][i], "lo": own["lo"][i], "hi": own["hi"][i]}
                 for i, q in enumerate(QUANTITIES)]
        if name == "baseline":
            continue
        delta = est[name] - est["baseline"]
        d = policy_interval(delta, jack[name] - jack["baseline"], jack2[name] - jack2["baseline"] if two else None, level)
        diffs += [{"condition": name, "quantity": q, "estimate": delta[i], "lo": d["lo"][i], "hi": d["hi"][i],
                   "p_t": d["p"][i]} for i, q in enumerate(QUANTITIES)]
    out_v, out_d = pd.DataFrame(rows), pd.DataFrame(diffs)
    for t in (out_v, out_d):
        t.attrs.update(level=level, documents=len(doc_ids),
                       interval=f"{INTERVAL_NAMES[own['interval']]} over documents (captures re-analysed)")
    return out_v, out_d


def read_conditions(diffs: pd.DataFrame, null: pd.DataFrame, quantity: str = "ap_drop_content", alpha: float = 0.05,
                    margin: float | None = None) -> pd.DataFrame:
    """Which interventions move ``quantity``: interval, the null's rank, Holm across the conditions, verdict.

    Each condition's difference to the baseline is ranked among the reseeded baselines' differences
    (``null``, no intervention): the two-sided p-value is ``(1 + #{|null| >= |difference|}) / (1 + n)``,
    whose floor is ``1 / (1 + n)``. The verdict on "the condition moves the quantity"
    (:func:`qkplast.stats.decision.verdict`, claim "differs") needs the policy's interval of the
    difference to exclude zero and the Holm-adjusted p (across the conditions) below ``alpha``; with a
    ``margin`` stated in advance an interval inside it is "no effect".
    """
    sub = diffs[diffs.quantity == quantity].set_index("condition")
    n = int(null[quantity].notna().sum())
    nulls = np.abs(null[quantity].dropna().to_numpy())
    out = sub[["estimate", "lo", "hi"]].copy()
    out["p (null rank)"] = [(1 + int(np.sum(nulls >= abs(e)))) / (1 + n) for e in out.estimate]
    out["p (Holm)"] = holm(out["p (null rank)"].to_numpy())
    out["verdict"] = [verdict(e, lo, hi, p, claim="differs", margin=margin, alpha=alpha)
                      for e, lo, hi, p in zip(out.estimate, out.lo, out.hi, out["p (Holm)"])]
    # the smallest Holm-adjusted p the family can reach: every reading at the floor, times the family's size
    out.attrs.update(quantity=quantity, n_null=n, floor=1 / (1 + n), null_q95=float(np.quantile(nulls, 0.95)) if n else np.nan,
                     alpha=alpha, holm_floor=len(out) / (1 + n), can_pass=bool(len(out) / (1 + n) < alpha))
    return out


def describe_conditions(diffs: pd.DataFrame, null: pd.DataFrame, quantities) -> pd.DataFrame:
    """Each condition's difference to the baseline for ``quantities``, beside the null, with no verdict.

    The parts the page does not decide: the estimate, the policy's interval and the share of the reseeded
    baselines' differences at least as far from 0 (``(1 + #{|null| >= |difference|}) / (1 + n)``, the quantity
    :func:`read_conditions` ranks, here not corrected for the many parts and conditions and not read as a test).

    Returns
    -------
    pandas.DataFrame
        Index (quantity, condition); columns ``estimate``, ``lo``, ``hi``, ``share of null as far``.
    """
    rows = []
    for q in quantities:
        nulls = np.abs(null[q].dropna().to_numpy())
        for _, r in diffs[diffs.quantity == q].iterrows():
            rows.append({"quantity": q, "condition": r.condition, "estimate": r.estimate, "lo": r.lo, "hi": r.hi,
                         "share of null as far": (1 + int(np.sum(nulls >= abs(r.estimate)))) / (1 + len(nulls))})
    out = pd.DataFrame(rows).set_index(["quantity", "condition"])
    out.attrs["n_null"] = int(null[list(quantities)].notna().all(axis=1).sum())
    return out


ROPE_LIKE = ("rope", "window")
SINK_LIKE = ("bos", "mid_document", "mask_first")


def mechanism_reading(reading: pd.DataFrame) -> str:
    """The section 7.6 reading computed from the conditions' verdicts: which kind of intervention moves the part."""
    moved = [c for c in reading.index if reading.loc[c, "verdict"] == "supported"]
    rope = [c for c in moved if c.startswith(ROPE_LIKE)]
    sink = [c for c in moved if c.startswith(SINK_LIKE)]
    if rope and not sink:
        return f"only RoPE or window conditions move it ({', '.join(rope)}): the data favour RoPE accumulation (or a length effect) over sink competition"
    if sink and not rope:
        return f"only initial-token conditions move it ({', '.join(sink)}): the data favour sink competition over RoPE accumulation"
    if rope and sink:
        return f"both kinds move it ({', '.join(moved)}): the data do not single out one mechanism"
    return "no condition moves it beyond the null with the correction: the data favour neither mechanism at this size"
