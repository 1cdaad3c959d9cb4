"""Bootstrap over documents: per-replicate re-analysis (old) versus reweighted sufficient statistics (new).

Workload (issue 9): 1000 replicates over the default run's capture (SmolLM2-135M,
270 RoPE heads, 8 documents, 16 buckets, 256 pairs). The old method
(``bootstrap(..., method="exact")``: materialise each replicate, re-analyse it)
is timed on ``--old-replicates`` replicates and scaled linearly to 1000 plus
the 8 jackknife fits BCa needs; the new one (``method="reweight"``) runs all
1000 and the jackknife. Both tables of intervals are printed.

    python benchmarks/bench_bootstrap.py [--run runs/smollm2-135m] [--threads 2] [--old-replicates 3]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

from qkplast.batch import load_or_capture
from qkplast.bootstrap import bootstrap


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/smollm2-135m", help="run directory of the default capture (made if absent)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--replicates", type=int, default=1000)
    ap.add_argument("--old-replicates", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    cap = load_or_capture(args.run)
    n_docs = len(np.unique(cap.doc.values))
    print(f"capture: {cap.attrs['model']}, {cap.sizes['head']} heads, {n_docs} documents, {cap.sizes['sample']} samples, "
          f"torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    old = bootstrap(cap, n_boot=max(2, args.old_replicates), seed=0, method="exact")
    t_old_measured = time.perf_counter() - t0
    per_fit = t_old_measured / (old.attrs["n_boot"] + n_docs + 1)  # replicates + jackknife + estimate
    t_old = per_fit * (args.replicates + n_docs + 1)
    t0 = time.perf_counter()
    new = bootstrap(cap, n_boot=args.replicates, seed=0, method="reweight")
    t_new = time.perf_counter() - t0
    print(f"\n{'method':62s} {'time (s)':>10s}")
    print(f"{'old: per-replicate re-analysis, ' + str(old.attrs['n_boot']) + ' replicates + jackknife measured':62s} "
          f"{t_old_measured:10.1f}   ({per_fit:.2f} s per fit)")
    print(f"{'old: scaled to ' + str(args.replicates) + ' replicates + jackknife':62s} {t_old:10.1f}")
    print(f"{'new: reweighted sufficient statistics, ' + str(args.replicates) + ' replicates + jackknife':62s} "
          f"{t_new:10.1f}   ({t_old / t_new:.0f}x)")
    print(f"target: {args.replicates} replicates over {cap.sizes['head']} heads under 60 s -> "
          f"{'met' if t_new < 60 else 'NOT met'}")
    cols = ["estimate", "lo", "hi", "lo_percentile", "hi_percentile", "lo_bca", "hi_bca", "se", "bias"]
    print(f"\nnew, {new.attrs['method']}")
    print(new[cols].to_dataframe().round(4).to_string())
    print(f"\nold ({old.attrs['n_boot']} replicates only: its intervals are not meaningful, shown for the estimate)")
    print(old[["estimate", "se"]].to_dataframe().round(4).to_string())


if __name__ == "__main__":
    main()
