"""Closed-form plasticity: vectorised kernel versus a straightforward per-pair loop, side by side.

Workload (issue 2): 300 heads x 16 query buckets x 256 key pairs, head dim 128.
Both paths start from the same rotated keys and the same per-bucket query model
(Householder, eqs. 4.10-4.12); they differ only in how the 1.2 M pair terms
(eqs. 4.11-4.14) are evaluated. The loop is timed on ``--loop-heads`` heads and
scaled linearly to 300 (it is linear in heads by construction); both the
measured and the scaled times are printed. The two results are compared
number by number.

    python benchmarks/bench_plasticity.py [--heads 300] [--loop-heads 4] [--device cpu]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from qkplast._torch import auto_chunk
from qkplast.options import AnalysisOptions
from qkplast.plasticity import bucket_layout, closed_form, plasticity, sample_key_pairs
from qkplast.synthetic import planted_capture


def per_pair_loop(qr, kr, mean, var, pairs, valid):
    """Reference: one Python iteration per (head, bucket, pair), scalar math only."""
    n_head, n_bucket, n_pairs = qr.shape[0], pairs[0].shape[0], pairs[0].shape[1]
    out = np.full((n_head, n_bucket, n_pairs), np.nan)
    for h in range(n_head):
        for b in range(n_bucket):
            for p in range(n_pairs):
                if not valid[b, p]:
                    continue
                delta = kr[h, pairs[0][b, p]] - kr[h, pairs[1][b, p]]
                mu = float(delta @ mean[h, b])
                v = float((delta * delta) @ var[h, b])
                z = mu / math.sqrt(v)
                out[h, b, p] = 4 * 0.5 * math.erfc(-z / math.sqrt(2)) * 0.5 * math.erfc(z / math.sqrt(2))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=300)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--loop-heads", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())

    cap, _ = planted_capture(n_heads=args.heads, dim=args.dim, seq_len=16 * 512, bucket_size=512, n_docs=32,
                             samples_per_bucket=2, seed=0)
    # pairs from any document and any earlier key, so every one of the 16 buckets gets its 256 pairs
    opt = AnalysisOptions(pair_docs="any", eligible_keys="before_query", n_pairs=256, device=args.device)
    dev = torch.device(args.device)
    pairs = sample_key_pairs(cap, opt)
    _, tau, _, _ = bucket_layout(cap, opt.query_position)
    print(f"workload: {args.heads} heads x {len(tau)} query buckets x {opt.n_pairs} pairs "
          f"({int(pairs.valid.sum()) * args.heads:,} pair terms), dim {args.dim}, {cap.sizes['sample']} samples, "
          f"device {args.device}, torch threads {torch.get_num_threads()}")

    q = torch.as_tensor(cap.q.values, dtype=torch.float64, device=dev)
    k = torch.as_tensor(cap.k.values, dtype=torch.float64, device=dev)
    t = torch.as_tensor(cap.position.values, dtype=torch.float64, device=dev)
    bucket = torch.as_tensor(cap.bucket.values, device=dev)
    onehot = (bucket[None] == torch.arange(len(tau), device=dev)[:, None]).double()
    pi, pj = torch.as_tensor(pairs.i, device=dev), torch.as_tensor(pairs.j, device=dev)
    tau_t = torch.as_tensor(tau, dtype=torch.float64, device=dev)

    def vectorised():
        outs = []
        chunk = auto_chunk(8 * len(tau) * opt.n_pairs * args.dim, dev)
        for s in range(0, args.heads, chunk):
            sl = slice(s, s + chunk)
            outs.append(closed_form(q[sl], k[sl], t, onehot, tau_t, pi, pj, opt))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return outs

    vectorised()  # warm-up
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        outs = vectorised()
        times.append(time.perf_counter() - t0)
    t_vec = min(times)
    pp_vec = torch.cat([o[3] for o in outs]).cpu().numpy()

    # the loop gets the same inputs (rotated keys, per-bucket query model), precomputed outside its timer
    n = args.loop_heads
    qr, delta, model, _ = closed_form(q[:n], k[:n], t, onehot, tau_t, pi, pj, opt)
    from qkplast.linalg import householder_apply, householder_vector
    from qkplast.stats import slope
    kr = householder_apply(householder_vector(slope(q[:n], t)), k[:n]).cpu().numpy()
    mean, var = model.mean.cpu().numpy(), model.cov.cpu().numpy()
    t0 = time.perf_counter()
    pp_loop = per_pair_loop(qr.cpu().numpy(), kr, mean, var, (pairs.i, pairs.j), pairs.valid)
    t_loop_measured = time.perf_counter() - t0
    t_loop = t_loop_measured * args.heads / n
    per_pair_us = 1e6 * t_loop_measured / (n * pairs.valid.sum())
    diff = np.nanmax(np.abs(pp_loop - pp_vec[:n]))

    t0 = time.perf_counter()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plasticity(cap, opt)
    t_full = time.perf_counter() - t0

    print(f"vectorised closed form, {args.heads} heads: {t_vec:.2f} s (best of {args.repeats}: "
          + ", ".join(f"{x:.2f}" for x in times) + ")")
    print(f"per-pair loop, {n} heads measured: {t_loop_measured:.2f} s ({per_pair_us:.1f} us per pair); "
          f"scaled to {args.heads} heads: {t_loop:.1f} s")
    print(f"ratio loop / vectorised: {t_loop / t_vec:.0f}x")
    print(f"max |difference| between the two on the {n} common heads: {diff:.2e}")
    print(f"whole plasticity() call (pair draw, closed form, Monte Carlo, 2D maps, aggregates): {t_full:.2f} s")
    print(f"target: 300-head closed-form batch under 5 s on CPU -> {'met' if t_vec < 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
