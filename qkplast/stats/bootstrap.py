"""Bootstrap confidence intervals over documents (the thesis reports none; section 7.5 names its limits).

The thesis reports point estimates. The unit of independent sampling in a
capture is the document: positions within one document share its content. A
replicate draws as many documents as the capture has, with replacement.

Two ways to compute a replicate, with the same statistics:

* ``method="reweight"`` (default; :mod:`qkplast.stats.reweight`): a replicate differs
  from the capture only in how often each document appears, so every moment
  is a reweighting of per-document sums, batched over replicates. The
  Householder basis, the positional fit, the per-bucket query model and the
  rotation axes are all recomputed per replicate; the key pairs are the full
  capture's, each weighted by its document's copy count.
* ``method="exact"``: the replicate is materialised (each drawn copy keeps its
  own id ``doc#copy`` so key pairs never straddle two copies) and re-analysed,
  key pairs redrawn. Slow; the reference, and the only way for options that
  reweighting cannot express (:func:`qkplast.stats.reweight.supports`).

Intervals (level 0.95 by default) are for the model-level means over heads:
basic, percentile, BCa (bias-corrected and accelerated; the acceleration
from a jackknife over documents, Efron 1987) and jackknife-t (the estimate
plus or minus ``t_{n-1}`` times the jackknife standard error). ``lo``/``hi``
hold the one the inference policy reports for this many documents
(:func:`qkplast.stats.intervals.interval_policy`: the bias-corrected
jackknife-t, with the standard error of the corrected estimate from
leave-two-out values below 8 documents), named in ``attrs["interval"]``;
``benchmarks/bench_coverage.py`` measures every method's coverage on planted
worlds. The jackknife intervals of a statistic with a range (:data:`RANGES`:
the AP aggregates in [0, 1], AP_drop in [-1, 1]) are computed on the logit or
Fisher-z scale and mapped back, so ``lo``/``hi`` never leave the range (NaN,
with ``reason``, where the data cannot give one).

:func:`document_jackknife` and :func:`document_interval` give the same
policy interval for any model-level statistic of a capture (the AP_drop
parts of :mod:`qkplast.analysis.decompose` among them) by re-analysing the
capture with each document left out (and each pair of documents, where
the policy needs it: :func:`document_jackknife2`). A statistic with an
``of_cuts`` method analyses all those left-out captures in one batch
(:func:`documents_left_out`, :mod:`qkplast.analysis.cuts`), and
:func:`document_replicates` keeps their values in a run directory through a
``store`` (:func:`qkplast.rundir.product_store`).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import xarray as xr
from scipy import stats

from qkplast.tensors import as_f64, resolve_device
from qkplast.options import AnalysisOptions
from qkplast.progress import progress_bar
from qkplast.analysis.vectors import analysis_vectors
from qkplast.analysis.plasticity import closed_form_ap, summarize_profile
from qkplast.stats.intervals import (SIGNED_RANGE, UNIT_RANGE, interval_policy, jackknife_t, leave_two_out,
                                     needs_leave_two_out,
                                     policy_interval)
from qkplast.stats.reweight import STATISTICS, reweighted_statistics, supports
from qkplast.analysis.rotation import rotation_kernel
# the version of bootstrap()'s output (bump it in qkplast.stats.schema) and the interval methods' words, which readers
# of finished runs import from there without torch or scipy
from qkplast.stats.schema import INTERVAL_NAMES, SCHEMA_VERSION  # noqa: F401

METRICS = STATISTICS
#: replicates by default: enough for 95% percentile and BCa end points
DEFAULT_REPLICATES = 1000
#: each statistic's range: the AP aggregates are probabilities ([0, 1], logit scale), AP_drop the difference of two
#: ([-1, 1], Fisher's z scale); bias_strength and key_position_slope have none. The jackknife intervals (the
#: policy's among them) are computed on the unbounded scale and mapped back, so they stay inside.
RANGES = {"ap_overall": UNIT_RANGE, "ap_first20": UNIT_RANGE, "ap_last20": UNIT_RANGE, "ap_drop": SIGNED_RANGE,
          "bias_strength": None, "key_position_slope": None,
          # the AP_drop parts (qkplast.analysis.decompose): each Drop(P, C) is a difference of two AP means, in
          # [-1, 1]; the bias and content parts differ two of them, the interaction adds four with signs
          "ap_drop_baseline": SIGNED_RANGE, "ap_drop_bias": (-2.0, 2.0), "ap_drop_content": (-2.0, 2.0),
          "ap_drop_interaction": (-4.0, 4.0)}
#: the reweighting computes the leave-two-out values up to this many documents (the policy needs them below 8;
#: the coverage benchmark compares both levels at 8 and 16)
LEAVE_TWO_OUT_UP_TO = 16


def metric_bounds(metrics=None) -> tuple[np.ndarray, np.ndarray]:
    """The ``bounds`` argument (:func:`qkplast.stats.intervals.policy_interval`) for a vector of statistics
    (:data:`METRICS` by default, or any names of :data:`RANGES`): their ranges' ends, infinite where a statistic has
    none."""
    ends = [RANGES[m] or (-np.inf, np.inf) for m in (METRICS if metrics is None else metrics)]
    return np.array([e[0] for e in ends], dtype=np.float64), np.array([e[1] for e in ends], dtype=np.float64)


def resample_documents(capture: xr.Dataset, rng: np.random.Generator) -> xr.Dataset:
    """One bootstrap replicate: documents drawn with replacement, each copy a distinct document."""
    docs, code = np.unique(capture.doc.values, return_inverse=True)
    members = [np.flatnonzero(code == d) for d in range(len(docs))]
    pick = rng.integers(0, len(docs), len(docs))
    idx = np.concatenate([members[d] for d in pick])
    new_doc = np.concatenate([np.full(len(members[d]), f"{docs[d]}#{c}") for c, d in enumerate(pick)])
    return capture.isel(sample=idx).assign_coords(doc=("sample", new_doc))


def model_level(capture: xr.Dataset, options: AnalysisOptions) -> dict[str, float]:
    """Means over heads of the closed-form plasticity aggregates, bias_strength and key_position_slope."""
    ap, lay = closed_form_ap(capture, options)
    agg = summarize_profile(ap, lay.pairs.tau, lay.width, lay.counts, int(capture.attrs["seq_len"]), options)
    dev = resolve_device(options.device)
    t = as_f64(capture["position"], dev)
    rot = [rotation_kernel(as_f64(capture["q"].values[s: s + 64], dev), as_f64(capture["k"].values[s: s + 64], dev), t)
           for s in range(0, capture.sizes["head"], 64)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = {name: float(np.nanmean(agg[name][1])) for name in METRICS[:4]}
    for name in METRICS[4:]:
        out[name] = float(torch.cat([r[name] for r in rot]).mean())
    return out


def document_weights(n_docs: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Copies of each document in each replicate ``[replicate, document]``: multinomial draws."""
    pick = rng.integers(0, n_docs, (n_boot, n_docs))
    return np.stack([np.bincount(row, minlength=n_docs) for row in pick]).astype(float)


#: replicates this close to the estimate (relative) are ties in BCa's bias correction (:func:`bca_interval`)
TIE_RTOL = 1e-9


def bca_interval(reps: np.ndarray, est: np.ndarray, jack: np.ndarray, level: float):
    """BCa end points per metric from replicates ``[replicate, metric]``, the estimate and jackknife values
    ``[document, metric]``; also returns ``z0`` (bias correction) and ``a`` (acceleration).

    ``z0 = Phi^-1(share of replicates below the estimate)``, ties counted half. Over a few documents many
    replicates are the original sample itself (each document drawn once: ``n!/n^n``, 9 % at 4 documents);
    they equal the estimate in exact arithmetic but are computed another way (reweighting), so they land a
    rounding error above or below it, and which side depends on the machine. A strict ``<`` would move ``z0``
    by up to ``Phi^-1`` of that share and the BCa end points with it, so replicates within
    :data:`TIE_RTOL` of the estimate (relative to the larger of ``|estimate|`` and the replicates' spread)
    count as ties.
    """
    alpha = (1 - level) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        tol = TIE_RTOL * np.maximum(np.abs(est), np.nanstd(reps, 0))  # [metric]
        tie = np.abs(reps - est) <= tol  # [replicate, metric]
        frac = (np.sum((reps < est) & ~tie, 0) + 0.5 * np.sum(tie, 0)) / np.sum(~np.isnan(reps), 0)
        z0 = stats.norm.ppf(np.clip(frac, 1e-12, 1 - 1e-12))
        dev = np.nanmean(jack, 0) - jack
        a = np.sum(dev**3, 0) / (6 * np.sum(dev**2, 0) ** 1.5)
    ends = []
    for z in (stats.norm.ppf(alpha), stats.norm.ppf(1 - alpha)):
        adj = stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
        ends.append(np.array([np.nanquantile(reps[:, m], adj[m]) if np.isfinite(adj[m]) else np.nan
                              for m in range(reps.shape[1])]))
    return ends[0], ends[1], z0, a


def bootstrap(capture: xr.Dataset, n_boot: int = DEFAULT_REPLICATES, level: float = 0.95, seed: int = 0,
              options: AnalysisOptions | None = None, progress: bool = False, method: str = "auto",
              **overrides) -> xr.Dataset:
    """Bootstrap over documents of the model-level AP aggregates, bias_strength and key_position_slope.

    Parameters
    ----------
    n_boot : int
        Replicates (1000 by default).
    method : {"auto", "reweight", "exact"}
        ``reweight``: batched reweighting of per-document sufficient statistics
        (:mod:`qkplast.stats.reweight`); ``exact``: re-analysis of each materialised
        replicate with redrawn key pairs; ``auto``: reweight when the options
        allow it, else exact.

    Returns
    -------
    xarray.Dataset
        Dim ``metric``: ``estimate`` (full capture), ``lo``/``hi`` (the policy's interval for this many
        documents, named in ``attrs["interval"]``; inside each statistic's range, :data:`RANGES`, computed on
        its logit / Fisher-z scale; NaN where undefined, with ``reason``: "undefined with N effective documents"
        and why, else ""), ``lo_basic``/``hi_basic``,
        ``lo_percentile``/``hi_percentile``, ``lo_bca``/``hi_bca`` (BCa, acceleration from the jackknife
        over documents ``jackknife``), ``lo_jackknife_t``/``hi_jackknife_t`` with ``se_jackknife``,
        ``lo_jackknife_bc``/``hi_jackknife_bc`` (around ``estimate_bc``, one-level standard error),
        ``lo_jackknife_bc2``/``hi_jackknife_bc2`` with ``se_jackknife_bc2`` (the same centre, the corrected
        estimate's standard error from ``jackknife2``, the leave-two-out values over ``document_pair``; NaN
        where they were not computed; the jackknife intervals all on the statistic's unbounded scale), ``p_jackknife``
        (two-sided p-value of zero of the policy's interval, ``n - 1`` degrees of freedom, on the Fisher-z scale for
        AP_drop, on the original scale for the [0, 1] aggregates, whose bound zero is), ``bias`` (mean of the
        replicates minus the estimate), ``se`` (bootstrap standard error), ``z0``, ``acceleration``,
        ``replicates`` (``metric, replicate``). Attrs: ``n_boot``, ``level``, ``seed``, ``n_docs``,
        ``interval``, ``method`` (which computation and which intervals, in words).

    Notes
    -----
    A replicate repeats documents, which shrinks the per-bucket query variances,
    makes score differences look more decisive and lowers plasticity: the
    replicates are biased low. The basic interval ``[2 est - q_hi, 2 est - q_lo]``
    uses only their spread around their own centre; the percentile interval
    inherits the shift; BCa corrects it through ``z0``. All three are
    returned, with the bias, so the reader can judge.
    """
    if n_boot < 2:
        raise ValueError(f"n_boot must be at least 2, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if method not in ("auto", "reweight", "exact"):
        raise ValueError(f"method must be 'auto', 'reweight' or 'exact', got {method!r}")
    docs = np.unique(capture.doc.values)
    n_docs = len(docs)
    if n_docs < 2:
        raise ValueError(f"a bootstrap over documents needs at least two documents, the capture has {n_docs}")
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)
    if method == "auto":
        method = "reweight" if supports(opt) else "exact"
    rng = np.random.default_rng(seed)
    est = np.array([model_level(capture, opt)[m] for m in METRICS])
    jack_w = 1.0 - np.eye(n_docs)
    pairs = leave_two_out(n_docs)
    two_w = 1.0 - np.eye(n_docs)[pairs[:, 0]] - np.eye(n_docs)[pairs[:, 1]]  # [pair, document]
    want_two = n_docs >= 3 and (needs_leave_two_out(n_docs) or (method == "reweight" and n_docs <= LEAVE_TWO_OUT_UP_TO))
    jack2 = np.full((len(pairs), len(METRICS)), np.nan)
    if method == "reweight":
        reps = reweighted_statistics(capture, document_weights(n_docs, n_boot, rng), opt)  # [replicate, metric]
        weights = np.concatenate([jack_w, two_w]) if want_two else jack_w
        both = reweighted_statistics(capture, weights, opt)  # [document (+ pair), metric]
        jack = both[:n_docs]
        jack2 = both[n_docs:] if want_two else jack2
    else:
        reps = np.array([list(model_level(resample_documents(capture, rng), opt).values())
                         for _ in progress_bar(range(n_boot), desc="bootstrap", enabled=progress)])
        without = lambda w: list(model_level(capture.isel(sample=np.flatnonzero(np.isin(  # noqa: E731
            capture.doc.values, docs[w > 0]))), opt).values())
        jack = np.array([without(w) for w in jack_w])
        if want_two:
            jack2 = np.array([without(w) for w in two_w])
    alpha = (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a metric NaN in every replicate stays NaN
        q_lo, q_hi = np.nanquantile(reps, alpha, axis=0), np.nanquantile(reps, 1 - alpha, axis=0)
        lo_bca, hi_bca, z0, acc = bca_interval(reps, est, jack, level)
        bias, se = np.nanmean(reps, axis=0) - est, np.nanstd(reps, axis=0, ddof=1)
    bounds = dict(bounds=metric_bounds(), unit="documents")  # each statistic's interval inside its range
    jt, jbc = jackknife_t(est, jack, level, **bounds), jackknife_t(est, jack, level, bias_correct=True, **bounds)
    jbc2 = jackknife_t(est, jack, level, bias_correct=True, jackknife2=jack2, **bounds) if want_two else \
        {k: np.full_like(est, np.nan) for k in ("lo", "hi", "se", "p")}
    pol = policy_interval(est, jack, jack2 if want_two else None, level, quantity=list(METRICS), **bounds)
    policy = interval_policy(n_docs)  # the metrics' interval; a metric may differ (``interval``, the policy by quantity)
    per_metric = np.broadcast_to(np.asarray(pol["interval"], dtype=object), est.shape).astype(str)  # [metric]
    how = ("per-document sufficient statistics reweighted, batched over replicates (key pairs of the full capture, "
           "weighted by document copies)" if method == "reweight" else
           "each replicate materialised and re-analysed, key pairs redrawn")
    ds = xr.Dataset(
        {
            "estimate": ("metric", est),
            "lo": ("metric", pol["lo"]),
            "hi": ("metric", pol["hi"]),
            "lo_basic": ("metric", 2 * est - q_hi),
            "hi_basic": ("metric", 2 * est - q_lo),
            "lo_percentile": ("metric", q_lo),
            "hi_percentile": ("metric", q_hi),
            "lo_bca": ("metric", lo_bca),
            "hi_bca": ("metric", hi_bca),
            "lo_jackknife_t": ("metric", jt["lo"]),
            "hi_jackknife_t": ("metric", jt["hi"]),
            "estimate_bc": ("metric", jbc["estimate"]),
            "lo_jackknife_bc": ("metric", jbc["lo"]),
            "hi_jackknife_bc": ("metric", jbc["hi"]),
            "lo_jackknife_bc2": ("metric", jbc2["lo"]),
            "hi_jackknife_bc2": ("metric", jbc2["hi"]),
            "se_jackknife": ("metric", jt["se"]),
            "se_jackknife_bc2": ("metric", jbc2["se"]),
            "p_jackknife": ("metric", pol["p"]),
            "interval": ("metric", per_metric),
            "reason": ("metric", pol["reason"].astype(str)),
            "bias": ("metric", bias),
            "se": ("metric", se),
            "z0": ("metric", z0),
            "acceleration": ("metric", acc),
            "replicates": (("metric", "replicate"), reps.T),
            "jackknife": (("metric", "document"), jack.T),
            "jackknife2": (("metric", "document_pair"), jack2.T),
        },
        coords={"metric": list(METRICS), "document": docs,
                "document_pair": [f"{docs[i]}|{docs[j]}" for i, j in pairs]},
        attrs={"n_boot": n_boot, "level": level, "seed": seed, "n_docs": n_docs, "computation": method,
               "interval": policy,
               "method": (f"bootstrap over documents, {n_boot} replicates ({how}); lo/hi: the policy's interval for "
                          f"{n_docs} documents ({INTERVAL_NAMES[policy]}{_exceptions(per_metric, policy)}); lo_basic/hi_basic: basic, "
                          f"lo_percentile/hi_percentile: percentile, lo_bca/hi_bca: BCa (acceleration from the "
                          f"jackknife over {n_docs} documents), lo_jackknife_t/hi_jackknife_t: jackknife-t with "
                          f"{n_docs - 1} degrees of freedom around the estimate, lo_jackknife_bc/hi_jackknife_bc: "
                          f"the same around the bias-corrected estimate estimate_bc, lo_jackknife_bc2/hi_jackknife_bc2: "
                          f"around estimate_bc with its own standard error (leave-two-out values); the jackknife "
                          f"intervals on the logit scale of the [0, 1] aggregates and the Fisher-z scale of ap_drop, "
                          f"mapped back; all at level {level}")},
    )
    return ds


def _exceptions(per_metric: np.ndarray, policy: str) -> str:
    """``"; ap_drop: jackknife-t"`` for the metrics whose interval differs from ``policy`` (variable ``interval``)."""
    other = [f"{m}: {INTERVAL_NAMES[p]}" for m, p in zip(METRICS, per_metric) if p != policy]
    return "; " + ", ".join(other) if other else ""


def documents_of(capture: xr.Dataset) -> np.ndarray:
    """The capture's document ids, sorted (the order of every per-document axis here)."""
    return np.unique(capture.doc.values)


def document_jackknife(capture: xr.Dataset, statistic, pairs_of: AnalysisOptions | None = None) -> np.ndarray:
    """``statistic`` of the capture with each document left out in turn: ``[document, ...]`` (sorted ids).

    ``statistic(capture) -> array_like`` is any model-level quantity (a mean over heads, a contrast of
    two, a vector of them); each leave-one-out capture is re-analysed whole (query model, fit), so the
    values carry every source of document-to-document variation. With ``pairs_of`` (the analysis options)
    the key pairs are drawn once, on the whole capture, and each left-out capture keeps its share of them
    (:func:`qkplast.analysis.pairs.pairs_without`): ``statistic(capture, pairs=...)`` is then called, and
    the leave-one-out values do not carry a fresh draw of pairs each (which a bias correction, multiplying
    their deviations by ``n - 1``, would amplify). A statistic with an ``of_cuts`` method analyses every
    left-out capture in one batched call (:func:`documents_left_out`).
    """
    docs = documents_of(capture)
    if len(docs) < 2:
        raise ValueError(f"a jackknife over documents needs at least two documents, the capture has {len(docs)}")
    return documents_left_out(capture, statistic, pairs_of, [[d] for d in docs])


def document_jackknife2(capture: xr.Dataset, statistic, pairs_of: AnalysisOptions | None = None) -> np.ndarray:
    """``statistic`` of the capture with each pair of documents left out: ``[pair, ...]``
    (:func:`qkplast.stats.intervals.leave_two_out` order over the sorted ids), re-analysed as in
    :func:`document_jackknife`; the second level of the policy's jackknife below 8 documents."""
    docs = documents_of(capture)
    if len(docs) < 3:
        raise ValueError(f"a leave-two-out jackknife needs at least three documents, the capture has {len(docs)}")
    return documents_left_out(capture, statistic, pairs_of, [docs[list(p)] for p in leave_two_out(len(docs))])


def document_jackknives(capture: xr.Dataset, statistic, pairs_of: AnalysisOptions | None = None,
                        two: bool | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`document_jackknife` and, where the policy needs them (``two``; default
    :func:`qkplast.stats.intervals.needs_leave_two_out`), :func:`document_jackknife2`'s values, from one call of
    :func:`documents_left_out` over every left-out capture (one batch for a statistic with ``of_cuts``)."""
    docs = documents_of(capture)
    if len(docs) < 2:
        raise ValueError(f"a jackknife over documents needs at least two documents, the capture has {len(docs)}")
    two = needs_leave_two_out(len(docs)) if two is None else two
    if two and len(docs) < 3:
        raise ValueError(f"a leave-two-out jackknife needs at least three documents, the capture has {len(docs)}")
    groups = [[d] for d in docs] + ([docs[list(p)] for p in leave_two_out(len(docs))] if two else [])
    values = documents_left_out(capture, statistic, pairs_of, groups)
    return values[:len(docs)], values[len(docs):] if two else None


def documents_left_out(capture: xr.Dataset, statistic, pairs_of, groups) -> np.ndarray:
    """``statistic`` of the capture without each group of documents ``[group, ...]``, key pairs drawn once when
    ``pairs_of``.

    A statistic with an ``of_cuts`` method (``statistic.of_cuts(capture, keeps, pairs) -> [cut, ...]``, with
    ``keeps`` the boolean sample masks ``[cut, sample]`` of the left-out captures and ``pairs`` their shares of the
    whole capture's pairs, or None) analyses all of them in one batched call
    (:class:`qkplast.analysis.decompose.ModelLevelTerms`, :mod:`qkplast.analysis.cuts`); any other is called on
    each left-out capture in turn.
    """
    from qkplast.analysis.pairs import pairs_without, sample_key_pairs

    full = sample_key_pairs(capture, pairs_of) if pairs_of is not None else None
    keeps = np.stack([~np.isin(capture.doc.values, group) for group in groups])  # [group, sample]
    pairs = None if full is None else [pairs_without(full, keep) for keep in keeps]
    of_cuts = getattr(statistic, "of_cuts", None)
    if of_cuts is not None:
        return np.asarray(of_cuts(capture, keeps, pairs), float)
    out = []
    for g, keep in enumerate(keeps):
        sub = capture.isel(sample=np.flatnonzero(keep))
        value = statistic(sub) if full is None else statistic(sub, pairs=pairs[g])
        out.append(np.asarray(value, float))
    return np.stack(out)


#: Version of the jackknife values :func:`document_replicates` keeps (``store``): bump it when their layout or
#: computation changes.
REPLICATES_SCHEMA = 1


def document_replicates(capture: xr.Dataset, statistic, pairs_of: AnalysisOptions | None = None, estimate=None, *,
                        store=None, stem: str | None = None, key: dict | None = None) -> dict:
    """``statistic`` of the whole capture and of the captures with each document (below 8 documents also each pair
    of documents) left out: what :func:`document_interval` builds the policy's interval from.

    Parameters
    ----------
    estimate : array_like, optional
        The statistic of the whole capture, when the caller has it (else computed).
    store : callable, optional
        ``store(stem, key, compute) -> xarray.Dataset`` (:func:`qkplast.rundir.product_store`): the values are kept
        under ``stem`` and read back while the key matches. ``key`` must name the statistic and everything it
        depends on besides the capture (its settings, ``qkplast.provenance.product_provenance`` of its code); the
        capture's content (:func:`qkplast.provenance.content_digest`), ``pairs_of``, the schema and the documents
        left out are added here.

    Returns
    -------
    dict
        ``point`` (the whole capture's), ``jackknife`` ``[document, ...]`` and ``jackknife2`` ``[pair, ...]`` or None.
    """
    docs = documents_of(capture)
    two = needs_leave_two_out(len(docs))

    def compute() -> xr.Dataset:
        point = np.asarray(statistic(capture) if estimate is None else estimate, float)
        jack, jack2 = document_jackknives(capture, statistic, pairs_of, two)
        flat = lambda x: x.reshape(len(x), -1)  # noqa: E731  [replicate, value]
        out = xr.Dataset({"point": ("value", point.reshape(-1)), "jackknife": (("document", "value"), flat(jack))},
                         coords={"document": docs.astype(str)}, attrs={"shape": list(point.shape)})
        if two:
            out["jackknife2"] = (("document_pair", "value"), flat(jack2))
        return out

    if store is None:
        kept = compute()
    else:
        from qkplast.provenance import content_digest

        full_key = {"schema": REPLICATES_SCHEMA, **(key or {}), "capture": content_digest(capture),
                    "pairs_of": None if pairs_of is None else pairs_of.result_key(), "leave_two_out": bool(two),
                    "estimate": None if estimate is None else np.asarray(estimate, float).reshape(-1).tolist()}
        kept = store(stem, full_key, compute)
    shape = tuple(int(n) for n in np.atleast_1d(kept.attrs.get("shape", [])))
    unflat = lambda x: x.reshape(len(x), *shape)  # noqa: E731
    return {"point": kept["point"].values.reshape(shape), "jackknife": unflat(kept["jackknife"].values),
            "jackknife2": unflat(kept["jackknife2"].values) if two else None}


def document_interval(capture: xr.Dataset, statistic, level: float = 0.95, estimate=None,
                      pairs_of: AnalysisOptions | None = None, bounds=None, quantity=None, *, store=None,
                      stem: str | None = None, key: dict | None = None) -> dict:
    """The policy's interval over documents for any model-level ``statistic`` of a capture, from the jackknife.

    The policy (:func:`qkplast.stats.intervals.interval_policy`) is the bias-corrected jackknife-t; each
    left-out capture is re-analysed whole, with the whole capture's key pairs when ``pairs_of`` (the
    analysis options) is given (:func:`document_jackknife`), and below 8 documents each capture without two
    of them as well (:func:`document_jackknife2`), for the corrected estimate's own standard error; a statistic
    with an ``of_cuts`` method analyses all of them in one batch (:func:`documents_left_out`). ``bounds``
    (the statistic's range, :func:`qkplast.stats.intervals.policy_interval`) keeps the interval inside it;
    ``quantity`` (its name, or one per element) picks the policy by quantity (``interval`` then per element).
    ``store``, ``stem`` and ``key`` keep the values and read them back (:func:`document_replicates`).

    Returns
    -------
    dict
        :func:`qkplast.stats.intervals.jackknife_t`'s fields (``estimate`` is the interval's centre, the
        bias-corrected estimate) plus ``point`` (the statistic on the whole capture), ``jackknife`` (the
        leave-one-out values), ``jackknife2`` (the leave-two-out values, or None) and ``interval`` (the method's name).
    """
    values = document_replicates(capture, statistic, pairs_of, estimate, store=store, stem=stem, key=key)
    est = values["point"]
    out = policy_interval(est, values["jackknife"], values["jackknife2"], level, bounds=bounds, unit="documents",
                          quantity=quantity)
    out.update(jackknife=values["jackknife"], jackknife2=values["jackknife2"], point=est)
    return out


def head_bootstrap(values: np.ndarray, n_boot: int = DEFAULT_REPLICATES, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean over heads, resampling heads with replacement.

    It measures how much the model-level mean depends on which heads were sampled, not the variation over
    documents (for that, :func:`bootstrap`): the cross-run tables of chapter 6 (:mod:`qkplast.results.crossrun`)
    read only each run's metrics, not its capture.

    Parameters
    ----------
    values : numpy.ndarray
        One value per head; NaN heads are left out.
    n_boot : int
        Replicates: one vectorised draw of ``n_boot x n_heads`` indices.
    seed : int
        Seed of the draw (a CPU generator).
    level : float
        Central probability of the interval.

    Returns
    -------
    tuple of float
        ``(lo, hi)``, the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the replicates' means (float64).
    """
    x = torch.as_tensor(values[~np.isnan(values)], dtype=torch.float64)  # [head]
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(x), (n_boot, len(x)), generator=gen)  # [replicate, head]
    means = x[idx].mean(1)  # [replicate]
    q = torch.quantile(means, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return float(q[0]), float(q[1])
