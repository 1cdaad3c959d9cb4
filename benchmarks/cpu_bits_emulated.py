"""Does a CPU training give the same bits on another processor? Checked on one machine with QEMU's emulator.

Stage A of a smoke-sized training (``--steps``, default 20) is trained in-process under the training worker's
settings (``qkplast.train.model.CPU_KERNEL_ENV``, one thread) twice: natively, and under QEMU's user-mode
emulator with another CPU model (``--cpu``, default ``Skylake-Server``: a GenuineIntel Xeon to MKL's dispatch,
with ``rsqrtps`` and ``rcpps`` computed by the emulator, not by this processor). The script prints each checkpoint's
weight hash for both and exits 1 when they differ. ``--stock-adamw`` trains with torch's own AdamW step instead
of :func:`qkplast.train.optim.adamw_step`, which shows what the exact root fixes::

    apt-get install qemu-user                                    # Debian's package, once
    .venv/bin/python benchmarks/cpu_bits_emulated.py             # about 5 min on 2 cores
    .venv/bin/python benchmarks/cpu_bits_emulated.py --stock-adamw

On 2026-11-29 on an AMD EPYC (Zen 3), QEMU 7.2: with the exact root both runs had the same four checkpoints;
with ``--stock-adamw`` they differed from step 2 on, and in the same way under ``--cpu EPYC-Milan``
(book/reference.md, "Where it trains").
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _config(steps: int):
    from qkplast.train import PRESETS, TrainConfig

    return TrainConfig.from_kwargs(PRESETS["smoke"], seeds=1, steps=steps, warmup=min(4, steps - 1),
                                   arms=("control",), device="cpu")


def _child(data: Path, out: Path, steps: int, stock: bool) -> None:
    """Train stage A in this process (the emulated one, or the native one) and print the checkpoints' hashes."""
    import torch

    from qkplast.train import hub_cache, repo_id
    from qkplast.train import loop
    from qkplast.train.hub import snapshot

    torch.set_num_threads(1)
    if stock:
        loop.adamw_step = lambda optimizer: optimizer.step()  # torch's own root
    config = _config(steps)
    out.mkdir(parents=True)
    for name in ("data", "tokenizer", "config.json"):
        if (data / name).exists():
            os.symlink(data / name, out / name)
    loop.train_arm(config, out, 0, "stageA", device="cpu")
    for step in config.checkpoint_steps("stageA"):
        weights = snapshot(hub_cache(out), repo_id(0), f"stageA-step{step}") / "model.safetensors"
        print(f"stageA-step{step} {hashlib.sha256(weights.read_bytes()).hexdigest()[:16]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu", default="Skylake-Server", help="a QEMU CPU model (qemu-x86_64 -cpu help)")
    parser.add_argument("--stock-adamw", action="store_true", help="torch's AdamW step, not the exact-root one")
    parser.add_argument("--child", nargs=2, metavar=("DATA", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(Path(args.child[0]), Path(args.child[1]), args.steps, args.stock_adamw)
        return 0
    if shutil.which("qemu-x86_64") is None:
        print("cpu_bits_emulated: qemu-x86_64 not found; install Debian's qemu-user (apt-get install qemu-user)",
              file=sys.stderr)
        return 2
    from qkplast.train import train
    from qkplast.train.model import CPU_KERNEL_ENV

    env = {**os.environ, **CPU_KERNEL_ENV, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        train(_config(args.steps), data, progress=False)  # the tokenizer and token data (and a first training)
        child = [__file__, "--steps", str(args.steps), *(["--stock-adamw"] if args.stock_adamw else [])]
        runs = {}
        for name, prefix in (("native", []), (f"emulated {args.cpu}", ["qemu-x86_64", "-cpu", args.cpu])):
            done = subprocess.run([*prefix, sys.executable, *child, "--child", str(data), str(Path(tmp) / name)],
                                  env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return done.returncode
            runs[name] = dict(line.split() for line in done.stdout.splitlines() if line.startswith("stageA-step"))
    (a, ra), (b, rb) = runs.items()
    print(f"AdamW: {'torch (stock)' if args.stock_adamw else 'exact root'}; checkpoint  {a}  {b}")
    for step in ra:
        print(f"  {step:14s} {ra[step]}  {rb[step]}  {'same' if ra[step] == rb[step] else 'DIFFERENT'}")
    same = ra == rb
    print("same bits at every checkpoint" if same else "the bits differ")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
