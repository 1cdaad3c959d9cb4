"""Bootstrap over documents: per-replicate re-analysis (old) versus reweighted sufficient statistics (new).

Workload (issue 9): 1000 replicates over the default run's capture (SmolLM2-135M,
270 RoPE heads, 8 documents, 16 buckets, 256 pairs). The old method
(``bootstrap(..., method="exact")``: materialise each replicate, re-analyse it)
is timed on ``--old-replicates`` replicates and scaled linearly to 1000 plus
the 8 jackknife fits BCa needs; the new one (``method="reweight"``) runs all
1000 and the jackknife. Both tables of intervals are printed. Wall and CPU
(process) seconds are printed: on a shared machine the wall time depends on
the load, the CPU time much less; on an idle machine wall ~ CPU / threads.

    python benchmarks/bench_bootstrap.py [--run runs/smollm2-135m] [--threads 2] [--old-replicates 3]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

from qkplast.rundir import load_or_capture
from qkplast.stats.bootstrap import bootstrap


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
    t0, c0 = time.perf_counter(), time.process_time()
    old = bootstrap(cap, n_boot=max(2, args.old_replicates), seed=0, method="exact")
    t_old_measured, c_old_measured = time.perf_counter() - t0, time.process_time() - c0
    fits = old.attrs["n_boot"] + n_docs + 1  # replicates + jackknife + estimate
    scale = (args.replicates + n_docs + 1) / fits
    t0, c0 = time.perf_counter(), time.process_time()
    new = bootstrap(cap, n_boot=args.replicates, seed=0, method="reweight")
    t_new, c_new = time.perf_counter() - t0, time.process_time() - c0
    print(f"\n{'method':64s} {'wall (s)':>9s} {'CPU (s)':>9s}")
    print(f"{'old: per-replicate re-analysis, ' + str(old.attrs['n_boot']) + ' replicates + jackknife, measured':64s} "
          f"{t_old_measured:9.1f} {c_old_measured:9.1f}   ({c_old_measured / fits:.2f} CPU s per fit)")
    print(f"{'old: scaled to ' + str(args.replicates) + ' replicates + jackknife':64s} {t_old_measured * scale:9.1f} "
          f"{c_old_measured * scale:9.1f}")
    print(f"{'new: reweighted sufficient statistics, ' + str(args.replicates) + ' replicates + jackknife':64s} "
          f"{t_new:9.1f} {c_new:9.1f}   ({c_old_measured * scale / c_new:.0f}x less CPU)")
    print(f"target: {args.replicates} replicates over {cap.sizes['head']} heads under 60 s on 2 cores -> wall {t_new:.0f} s "
          f"({'met' if t_new < 60 else 'NOT met'} here), CPU {c_new:.0f} s (an idle 2-core machine needs about "
          f"CPU / 2 to CPU: {'met' if c_new < 60 else 'not shown'})")
    cols = ["estimate", "lo", "hi", "lo_percentile", "hi_percentile", "lo_bca", "hi_bca", "se", "bias"]
    print(f"\nnew, {new.attrs['method']}")
    print(new[cols].to_dataframe().round(4).to_string())
    print(f"\nold ({old.attrs['n_boot']} replicates only: its intervals are not meaningful, shown for the estimate)")
    print(old[["estimate", "se"]].to_dataframe().round(4).to_string())


if __name__ == "__main__":
    main()
