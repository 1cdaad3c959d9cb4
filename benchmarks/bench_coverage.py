"""Actual coverage of every interval method over documents, on planted worlds with document-to-document variation.

A *world* is a planted model (:func:`qkplast.theory.planted.planted_capture`) whose heads are fixed
(``world_seed``) and whose documents are random draws: each document shifts the query and key content
means and the query intercept, and scales both drifts and the query content spread (``doc_effect``).
Two worlds (:data:`WORLDS`): one where the query content spread also shrinks with position
(``content_floor``), so ``ap_drop`` has a drift part and a content part, and one where the keys drift off
the query's drift axis with twice the document-to-document variation. Its *truth* is the analysis of one very large capture of the same world (``--truth-docs``
documents, the closed form averaged over ``--truth-seeds`` key-pair draws): what the estimators converge to
as documents are added. For each document count, ``--replicates`` independent captures are analysed and
each interval method's end points compared with the truth:

* for ``bias_strength``, ``key_position_slope``, ``ap_overall``, ``ap_first20``, ``ap_last20``, ``ap_drop``
  (:func:`qkplast.stats.bootstrap.bootstrap`, 1000 replicates by reweighting): the policy's interval, basic,
  percentile, BCa, jackknife-t around the estimate (leave-one-document-out values by reweighting),
  the bias-corrected jackknife-t (the same half-width around ``n estimate - (n - 1) mean(jackknife)``) and
  the same centre with the corrected estimate's own standard error (leave-two-out values, up to 16 documents);
* for ``ap_drop`` and its four parts (:mod:`qkplast.analysis.decompose`): jackknife-t over documents with
  each leave-one-out capture re-analysed whole with its share of the whole capture's key pairs, plain and
  bias-corrected, and the policy's interval (:func:`qkplast.stats.bootstrap.document_interval`, the interval
  the book reports for the parts: below 8 documents with each pair of documents left out as well);
* for ``ap_drop`` under Definition 4.3's prefix weighting of key pairs (``pair_weight="prefix"``, chapter 07
  item 11; quantity ``ap_drop (prefix)``): the bootstrap's jackknife intervals.

Every jackknife interval (the policy's among them) is computed on the scale of its quantity's range
(:data:`qkplast.stats.bootstrap.RANGES`: logit for the [0, 1] aggregates, Fisher's z for AP_drop, the parts'
ranges likewise) and mapped back; ``policy (unbounded)`` is the same interval on the original scale, the
policy before it respected ranges, for comparison. Extra quantities a caller wants covered plug in through
:data:`EXTRA_STATISTICS` (name -> ``(statistic(capture, pairs=None), range)``, given the policy's interval by
:func:`qkplast.stats.bootstrap.document_interval`; its truth from the large capture).

The table goes to ``data/coverage.csv`` (one row per world, document count, quantity and method: coverage,
its binomial standard error, the share of misses below and above, mean width; ``run``: the run's ``--label``; rows kept
by ``--merge`` keep theirs), each world's truth to
``data/coverage_truth.csv`` (computed once, reused by later runs with the same ``--truth-docs``). Not part of the book build:

    python benchmarks/bench_coverage.py [--replicates 10] [--first-replicate 0] [--docs 4 8 16] [--workers 2]

The default (10 captures per cell) is a smoke run of a few minutes: one capture with 1000 bootstrap replicates took
11 s at 4 documents, 6 s at 8 and 14 s at 16 (one core, busy machine), so 10 captures of 2 worlds at 3 document
counts are about 5 minutes with 2 workers. A table to choose by needs hundreds of captures per cell: the stored one
rests on the runs chapter 07 names (``--replicates``, ``--first-replicate``, ``--raw`` and ``--from-raw`` split
them; ``--n-boot 2`` measures only the jackknife intervals, the policy's among them, at about half the cost: 2.5 s,
3.7 s and 7 s a capture on the same machine, and ``--merge data/coverage.csv`` keeps the stored rows it does not
measure).

Each replicate runs single-threaded in its own process; ``--workers`` processes run at once.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, TimeoutError
from pathlib import Path

import numpy as np
import pandas as pd

_SHAPE = dict(n_heads=4, dim=8, seq_len=2048, bucket_size=128, samples_per_bucket=8)
#: the planted worlds: "drift and content" has both drifts on one axis and a shrinking query content spread
#: (AP_drop has a drift part and a content part); "key drift off axis" has the keys drifting off the query's
#: drift axis, no content change and twice the document-to-document variation
WORLDS = {
    "drift and content": dict(_SHAPE, doc_effect=0.3, content_floor=0.5, world_seed=1),
    "key drift off axis": dict(_SHAPE, doc_effect=0.6, key_axis=3, world_seed=2),
}
BOOT_METRICS = ("ap_overall", "ap_first20", "ap_last20", "ap_drop", "bias_strength", "key_position_slope")
PART_QUANTITIES = ("ap_drop", "ap_drop_baseline", "ap_drop_bias", "ap_drop_content", "ap_drop_interaction")
BOOT_METHODS = {"policy": ("lo", "hi"), "basic": ("lo_basic", "hi_basic"), "percentile": ("lo_percentile", "hi_percentile"),
                "BCa": ("lo_bca", "hi_bca"), "jackknife-t": ("lo_jackknife_t", "hi_jackknife_t"),
                "bias-corrected jackknife-t": ("lo_jackknife_bc", "hi_jackknife_bc"),
                "bias-corrected jackknife-t, two-level se": ("lo_jackknife_bc2", "hi_jackknife_bc2")}
#: the methods read from the bootstrap's replicates; left out with ``--n-boot`` below :data:`MIN_REPLICATES` (a run
#: of the jackknife intervals only), and their code unchanged since the stored table's earlier rows (``--merge``)
REPLICATE_METHODS = ("basic", "percentile", "BCa")
MIN_REPLICATES = 100
#: the AP_drop parts' methods (each left-out capture re-analysed); "policy (re-analysed)" is what the book reports
PART_METHODS = ("jackknife-t (re-analysed)", "bias-corrected jackknife-t (re-analysed)", "policy (re-analysed)")
#: the bootstrap's jackknife intervals of AP_drop under the prefix weighting (item 11 of chapter 07)
PREFIX_METHODS = {k: BOOT_METHODS[k] for k in ("policy", "jackknife-t", "bias-corrected jackknife-t",
                                               "bias-corrected jackknife-t, two-level se")}
#: further model-level statistics to cover: name -> (statistic(capture, pairs=None) -> float, (lo, hi) or None);
#: empty here, a hook for quantities defined above the stats layer
EXTRA_STATISTICS: dict = {}


def _quiet():
    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)


#: quantities added to the truth after the stored one was computed: computed alone for a world whose stored truth
#: lacks them (with :data:`EXTRA_STATISTICS`), the rest of the row reused
LATE_TRUTHS = ("ap_drop (prefix)",)


def truth(args) -> dict[str, float]:
    """A world's quantities from one capture of ``n_docs`` documents with key-pair draw ``seed`` (only those in
    ``only`` when it is not None)."""
    world, n_docs, seed, only = args
    want = lambda name: only is None or name in only  # noqa: E731
    _quiet()
    from qkplast.analysis.decompose import model_level_terms
    from qkplast.options import AnalysisOptions
    from qkplast.stats.bootstrap import model_level
    from qkplast.theory.planted import planted_capture

    cap, _ = planted_capture(n_docs=n_docs, seed=10**6, **WORLDS[world])
    opt = AnalysisOptions(seed=seed)
    row = {}
    if only is None:
        row.update(model_level(cap, opt))
        row.update({f"{k} (parts)": v for k, v in model_level_terms(cap, opt).items()})
    if want("ap_drop (prefix)"):
        row["ap_drop (prefix)"] = model_level(cap, AnalysisOptions(seed=seed, pair_weight="prefix"))["ap_drop"]
    row.update({name: float(f(cap)) for name, (f, _) in EXTRA_STATISTICS.items() if want(name)})
    return {"world": world, **row}


def one_replicate(args) -> list[dict]:
    """Every method's interval for one capture of ``n_docs`` documents (replicate ``r``)."""
    world, n_docs, r, n_boot, parts_only = args
    _quiet()
    from qkplast.analysis.decompose import model_level_terms
    from qkplast.options import AnalysisOptions
    from qkplast.stats.bootstrap import bootstrap, document_interval, metric_bounds
    from qkplast.stats.intervals import jackknife_t, policy_interval
    from qkplast.theory.planted import planted_capture

    cap, _ = planted_capture(n_docs=n_docs, seed=1000 * n_docs + r, **WORLDS[world])
    row = dict(world=world, docs=n_docs, replicate=r)
    rows = []
    if not parts_only:
        methods = {k: v for k, v in BOOT_METHODS.items() if n_boot >= MIN_REPLICATES or k not in REPLICATE_METHODS}
        rows += _boot_rows(bootstrap(cap, n_boot=n_boot, seed=r), row, BOOT_METRICS, methods, "")
        # AP_drop under Definition 4.3's weighting: only the jackknife intervals are read, so 2 replicates
        prefix = bootstrap(cap, n_boot=2, seed=r, options=AnalysisOptions(pair_weight="prefix"))
        rows += _boot_rows(prefix, row, ("ap_drop",), PREFIX_METHODS, " (prefix)")
    # AP_drop and its parts: a jackknife whose every capture is re-analysed whole (each keeping its share of the
    # whole capture's key pairs), plain, around the bias-corrected estimate, and the policy's interval, each on
    # the scale of its part's range
    opt = AnalysisOptions()
    bounds = metric_bounds(PART_QUANTITIES)
    parts = document_interval(cap, lambda c, pairs=None: [model_level_terms(c, opt, pairs=pairs)[q] for q in PART_QUANTITIES],
                              pairs_of=opt, bounds=bounds, quantity=list(PART_QUANTITIES))
    plain = jackknife_t(parts["point"], parts["jackknife"], bounds=bounds)
    corrected = jackknife_t(parts["point"], parts["jackknife"], bias_correct=True, bounds=bounds)
    free = policy_interval(parts["point"], parts["jackknife"], parts["jackknife2"], quantity=list(PART_QUANTITIES))
    named = np.broadcast_to(np.asarray(parts["interval"], dtype=object), len(PART_QUANTITIES))  # [quantity]
    for method, res in zip(PART_METHODS + (unbounded_name(PART_METHODS[-1]),), (plain, corrected, parts, free)):
        for i, q in enumerate(PART_QUANTITIES):
            rows.append({**row, "quantity": q + " (parts)", "method": method, "policy": str(named[i]),
                         "estimate": float(parts["point"][i]), "lo": float(res["lo"][i]), "hi": float(res["hi"][i])})
    for name, (statistic, rng) in EXTRA_STATISTICS.items():
        ci = document_interval(cap, statistic, bounds=rng)
        rows.append({**row, "quantity": name, "method": "policy (re-analysed)", "policy": ci["interval"],
                     "estimate": float(ci["point"]), "lo": float(ci["lo"]), "hi": float(ci["hi"])})
    return rows


def _boot_rows(boot, row: dict, metrics, methods: dict, suffix: str) -> list[dict]:
    """One row per metric and method of a bootstrap, and the policy's interval on the original scale beside them."""
    from qkplast.stats.intervals import policy_interval

    two = boot.jackknife2.values.T if boot.attrs["interval"] == "jackknife_bc2" else None
    free = policy_interval(boot.estimate.values, boot.jackknife.values.T, two,  # the policy without the ranges
                           quantity=list(boot.metric.values))
    rows = []
    for metric in metrics:
        b, i = boot.sel(metric=metric), list(boot.metric.values).index(metric)
        ends = {**{m: (float(b[lo]), float(b[hi])) for m, (lo, hi) in methods.items()},
                unbounded_name("policy"): (float(free["lo"][i]), float(free["hi"][i]))}
        rows += [{**row, "quantity": metric + suffix, "method": m, "policy": str(b.interval.values),
                  "estimate": float(b.estimate), "lo": lo, "hi": hi} for m, (lo, hi) in ends.items()]
    return rows


def coverage_table(raw: pd.DataFrame, true: pd.DataFrame) -> pd.DataFrame:
    """Coverage per (world, docs, quantity, method): share of intervals containing the truth, misses by side, width.

    ``true`` holds one row per world (columns: quantities).
    """
    long = true.melt(id_vars="world", var_name="quantity", value_name="truth")
    raw = raw.merge(long, on=["world", "quantity"], how="left")
    raw = raw.assign(covered=(raw.lo <= raw.truth) & (raw.truth <= raw.hi), below=raw.hi < raw.truth,
                     above=raw.lo > raw.truth, width=raw.hi - raw.lo)
    g = raw.groupby(["world", "docs", "quantity", "method"], sort=False)
    out = g.agg(replicates=("covered", "size"), coverage=("covered", "mean"), miss_below=("below", "mean"),
                miss_above=("above", "mean"), mean_width=("width", "mean"), truth=("truth", "first"),
                mean_estimate=("estimate", "mean"), policy=("policy", "first")).reset_index()
    out["coverage_se"] = np.sqrt(out.coverage * (1 - out.coverage) / out.replicates)
    return out


def unbounded_name(method: str) -> str:
    """The name of a jackknife method's interval on the original scale: ``policy`` -> ``policy (unbounded)``,
    ``policy (re-analysed)`` -> ``policy (re-analysed, unbounded)``."""
    return method[:-1] + ", unbounded)" if method.endswith(")") else method + " (unbounded)"


def merge_earlier(table: pd.DataFrame, earlier: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the rows of ``earlier`` in cells ``table`` lacks, each keeping its own ``run`` label.

    A stored table older than the ranges (no ``run`` column) measured the jackknife intervals on the original
    scale: its rows of those methods are renamed :func:`unbounded_name` (the replicates' methods keep their names)
    and labelled ``run='original scale'``.
    """
    key = ["world", "docs", "quantity", "method"]
    old = earlier.copy()
    if "run" not in old:
        jack = ~old.method.isin(REPLICATE_METHODS)
        old.loc[jack, "method"] = old.loc[jack, "method"].map(unbounded_name)
        old = old.assign(run="original scale")
    old = old.merge(table[key], on=key, how="left", indicator=True)
    old = old[old._merge == "left_only"].drop(columns="_merge")
    return pd.concat([table, old[table.columns.intersection(old.columns)]], ignore_index=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=10)
    ap.add_argument("--first-replicate", type=int, default=0,
                    help="replicate numbers start here (a confirmation run on captures no earlier run used)")
    ap.add_argument("--docs", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--n-boot", type=int, default=1000,
                    help=f"bootstrap replicates; below {MIN_REPLICATES} only the jackknife intervals are measured")
    ap.add_argument("--merge", default=None,
                    help="a stored table whose rows this run did not measure are kept with their own run labels (a "
                         "table older than the ranges: its jackknife methods renamed '... (unbounded)')")
    ap.add_argument("--label", default="this", help="this run's rows' label in column run (what and where it measured)")
    ap.add_argument("--truth-docs", type=int, default=1024)
    ap.add_argument("--truth-seeds", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worlds", nargs="+", choices=list(WORLDS), default=None)
    ap.add_argument("--deadline", type=float, default=0, help="seconds after which no further replicate is waited for")
    ap.add_argument("--raw", default=None, help="also write every interval (one row per replicate, quantity, method)")
    ap.add_argument("--from-raw", nargs="+", default=None, help="only rebuild the table from the --raw files of earlier runs")
    ap.add_argument("--parts-only", action="store_true", help="only the AP_drop parts' intervals (no bootstrap)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "coverage.csv"))
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0, c0 = time.perf_counter(), time.process_time()
    worlds = args.worlds or list(WORLDS)
    if args.from_raw:  # the table again from the intervals of earlier runs (e.g. one run per document count)
        raw = pd.concat([pd.read_csv(f) for f in args.from_raw], ignore_index=True)
        true = pd.read_csv(Path(args.out).with_name("coverage_truth.csv"))
        true = true[true.truth_docs == args.truth_docs].drop(columns=["truth_docs", "truth_seeds"])
        table = coverage_table(raw, true).assign(run=args.label)
        if args.merge:
            table = merge_earlier(table, pd.read_csv(args.merge))
        table.to_csv(args.out, index=False, float_format="%.6g")
        print(table.pivot_table(index=["world", "quantity", "method"], columns="docs", values="coverage",
                                sort=False).round(3).to_string())
        return
    # replicate-major order: a run stopped by --deadline leaves every (world, docs) cell with the same count
    jobs = [(w, n, r, args.n_boot, args.parts_only) for r in range(args.first_replicate, args.first_replicate + args.replicates)
            for n in args.docs for w in worlds]
    truth_file = Path(args.out).with_name("coverage_truth.csv")
    known = pd.read_csv(truth_file) if truth_file.exists() else pd.DataFrame(columns=["world", "truth_docs"])
    known = known[(known.truth_docs == args.truth_docs) & known.world.isin(worlds)]
    # each world's truth is computed once; a quantity added later is computed alone for the worlds that lack it
    late = list(LATE_TRUTHS) + list(EXTRA_STATISTICS)
    lacking = {w: [c for c in late if c not in known.columns or known.loc[known.world == w, c].isna().any()]
               for w in known.world}
    truth_jobs = [(w, args.truth_docs, s, lacking.get(w)) for w in worlds for s in range(args.truth_seeds)
                  if w not in lacking or lacking[w]]
    with ProcessPoolExecutor(args.workers) as pool:
        truths = [pool.submit(truth, job) for job in truth_jobs]  # the slowest first, beside the replicates
        pending = [pool.submit(one_replicate, job) for job in jobs]
        rows, stopped = [], 0
        for future in pending:
            left = args.deadline - (time.perf_counter() - t0) if args.deadline else None
            try:
                rows += future.result(timeout=max(left, 0.0) if left is not None else None)
            except TimeoutError:
                stopped = sum(f.cancel() or not f.done() for f in pending)
                break
        if truths:
            fresh = pd.DataFrame([t.result() for t in truths]).groupby("world", sort=False).mean()
            fresh["truth_docs"], fresh["truth_seeds"] = args.truth_docs, args.truth_seeds
            merged = fresh.combine_first(known.set_index("world"))  # a late quantity joins its world's stored row
            known = merged[list(known.columns.drop("world")) + [c for c in merged.columns if c not in known.columns]]
            known = known.reset_index()
            known.to_csv(truth_file, index=False, float_format="%.10g")
        true = known.drop(columns=["truth_docs", "truth_seeds"])
    if stopped:
        print(f"deadline reached: {stopped} replicates not run; the table counts the replicates each row rests on")
    raw = pd.DataFrame(rows)
    if args.raw:
        raw.to_csv(args.raw, index=False, float_format="%.8g")
    table = coverage_table(raw, true).assign(run=args.label)
    if args.merge:
        table = merge_earlier(table, pd.read_csv(args.merge))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g")
    wide = table.pivot_table(index=["world", "quantity", "method"], columns="docs", values="coverage", sort=False)
    for w in worlds:
        print(f"world {w!r}: {WORLDS[w]}")
    print(f"truth from {args.truth_docs} documents x {args.truth_seeds} pair draws; "
          f"{args.replicates} captures per document count, {args.n_boot} bootstrap replicates each")
    print(wide.round(3).to_string())
    print(f"wrote {args.out}; wall {time.perf_counter() - t0:.0f} s with {args.workers} workers "
          f"(CPU of this process {time.process_time() - c0:.0f} s; the workers' is not counted)")


if __name__ == "__main__":
    main()
