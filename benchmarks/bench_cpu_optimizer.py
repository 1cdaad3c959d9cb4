"""The price of the correctly rounded root in AdamW (qkplast.train.optim), on the CPU training's own settings.

A CPU training step of the miniature is a forward pass, a backward pass and an AdamW step. This times, side by
side in one process (alternating, best of ``--repeats``), on the default preset's Llama shape and random
gradients: a whole forward and backward pass on one batch, torch's AdamW step, and
:func:`qkplast.train.optim.adamw_step`; it prints each time, the two steps' ratio and what the exact root adds to
a training step. Run it under the training worker's kernels, as the training does::

    ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE .venv/bin/python benchmarks/bench_cpu_optimizer.py

Without those two variables it refuses (exit 2): the figures would not be the training's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="default", help="a TrainConfig preset (default: default)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, alternating (default: 5)")
    args = parser.parse_args(argv)
    from qkplast.train.model import CPU_KERNEL_ENV

    unset = {k: v for k, v in CPU_KERNEL_ENV.items() if os.environ.get(k) != v}
    if unset:
        print("bench_cpu_optimizer: set " + " ".join(f"{k}={v}" for k, v in unset.items()) +
              " before python starts (the training worker's kernels)", file=sys.stderr)
        return 2
    import torch

    from qkplast.train import PRESETS
    from qkplast.train.model import build_model
    from qkplast.train.optim import adamw_step

    torch.set_num_threads(1)  # as the worker trains
    config = PRESETS[args.preset]
    model = build_model(config, "stageA", eot=0, seed=0)
    x = torch.randint(0, config.vocab_size, (config.batch, config.window))  # [batch, window]
    times = {"forward+backward": [], "torch AdamW step": [], "exact-root AdamW step": []}
    adamw = dict(lr=config.lr, betas=(0.9, config.beta2), eps=1e-8, weight_decay=config.weight_decay)
    opts = {name: torch.optim.AdamW(model.parameters(), **adamw) for name in ("torch AdamW step",
                                                                            "exact-root AdamW step")}
    steps = {"torch AdamW step": lambda o: o.step(), "exact-root AdamW step": adamw_step}
    for _ in range(args.repeats + 1):  # the first round warms up and is dropped
        tic = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        times["forward+backward"].append(time.perf_counter() - tic)
        for name, opt in opts.items():
            tic = time.perf_counter()
            steps[name](opt)
            times[name].append(time.perf_counter() - tic)
        model.zero_grad(set_to_none=False)
    best = {name: min(t[1:]) for name, t in times.items()}
    n = sum(p.numel() for p in model.parameters())
    print(f"preset {args.preset}: {n:,} parameters, batch {config.batch} x window {config.window}, one thread, "
          f"{CPU_KERNEL_ENV}")
    for name, t in best.items():
        print(f"  {name:24s} {t * 1000:9.1f} ms (best of {args.repeats})")
    ratio = best["exact-root AdamW step"] / best["torch AdamW step"]
    step = best["forward+backward"] + best["torch AdamW step"]
    extra = (best["exact-root AdamW step"] - best["torch AdamW step"]) / step
    print(f"exact-root / torch AdamW step: {ratio:.2f}x; a whole training step {extra:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
