"""Chapter 10's full run (issue 36): pilots, the chosen setting on every seed, every checkpoint measured, the gates.

One command does what the issue asks of a lent GPU, in order, each step printed with its wall time:

1. the training data once (tokenizer and windows of ``studies/miniature-full.yaml``'s corpus), shared by every
   pilot and the full run (they differ only in optimisation settings);
2. the pilots of ``studies/miniature-pilots.yaml``: one seed each, stage A only, at the full length, side by side;
   each pilot's final checkpoint is measured and gated (:mod:`qkplast.train.gates`), and its tokens/s printed;
3. the full setting: the first pilot in the file's order whose seed passes every stage-A gate (the rule is
   committed with the pilots file, before the run), trained on every seed and arm (``qkplast train``'s code);
4. every checkpoint measured at L and 4L (16 held-out documents each; :func:`qkplast.train.evaluate.checkpoint_table`)
   and every seed's gates;
5. the export (``--export DIR``): what chapter 10 reads from ``data/miniature-full/``: ``provenance.json``
   (device, commit, config, wall times, pilots, the held-out baselines), ``training.json``, ``checkpoints.json``,
   ``gates.csv``, and
   ``seed0-checkpoints.tar.xz``, seed 0's decisive and "early" checkpoints in float16 for a reader to recapture
   on a CPU (``--repack DIR``: the same subset from an archive of every checkpoint).

Run on a lent GPU (the device tool; wheels prepared here with ``benchmarks/bench_gpu.py --prepare-wheels .whl``)::

    run(carry=[".whl"], timeout_s=600, command=
        "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
        ".whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 "
        "QKPLAST_COMMIT=<commit> python3 benchmarks/bench_miniature.py --out /tmp/mini --export $OUT "
        "2>&1 | tee $OUT/bench_miniature.log")

``--pilot-names`` runs only the named pilots; ``--pilots-only`` stops after them, and ``--require-pass`` stops
after them unless one passed every gate in all its seeds. A pilot that passed continues as the full run in its own
directory (its seeds' stage A is not trained again), so the pilot of the second amendment and the full run fit one
call (``--pilot-names bos-long --require-pass``: about 450 s on an H200, estimated from the first full run's rates).

``--selftest-cpu`` rehearses every step here on the CPU with tiny settings (a couple of minutes; the acceptance
tier runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FULL = ROOT / "studies" / "miniature-full.yaml"
PILOTS = ROOT / "studies" / "miniature-pilots.yaml"
START = time.perf_counter()


def say(message: str) -> None:
    print(f"[{time.perf_counter() - START:6.0f}s] {message}", flush=True)


def load_pilots(path: Path, base, names=None):
    """``[(name, TrainConfig, seeds)]`` of the pilots file: each entry's settings over the full study's config, and
    the seeds it trains (its ``seeds``, else seed 0); ``names``: only those pilots, in the file's order."""
    import yaml

    from qkplast.train.config import TrainConfig

    data = yaml.safe_load(Path(path).read_text())
    known = [p["name"] for p in data["pilots"]]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise SystemExit(f"bench_miniature: no pilot named {', '.join(unknown)} in {path}; its pilots: {', '.join(known)}")
    return [(p["name"], TrainConfig.from_kwargs(base, **(p.get("train") or {})), list(p.get("seeds", [0])))
            for p in data["pilots"] if not names or p["name"] in names]


def shared_data(config, data_dir: Path, out: Path) -> None:
    """Copy the prepared ``tokenizer/`` and ``data/`` of ``data_dir`` into training directory ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer", "data"):
        if not (out / name).exists():
            shutil.copytree(data_dir / name, out / name)


def run_pilots(pilots, data_dir: Path, root: Path, device: str, measure) -> list[dict]:
    """Stage A of every pilot's seeds, side by side in processes; then each final checkpoint measured and gated:
    one result per (pilot, seed)."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    jobs = []
    for name, config, seeds in pilots:
        d = root / f"pilot-{name}"
        shared_data(config, data_dir, d)
        (d / "config.json").write_text(json.dumps(config.to_dict(), indent=1))
        jobs += [(name, config, d, seed) for seed in seeds]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(jobs), mp_context=context) as pool:
        records = list(pool.map(_pilot_stage_a, *zip(*[(c, d, seed) for _, c, d, seed in jobs])))
    results = []
    for (name, config, d, seed), record in zip(jobs, records):
        row = measure(config, d, record, seed)
        results.append({"name": name, "seed": seed, "settings": config.to_dict(), "record": _summary(record), **row})
        say(f"pilot {name} seed {seed}: {row['tokens_per_s']:.0f} tok/s, gates " +
            ", ".join(f"{g['gate']} {g['value']:.3f} ({'pass' if g['passed'] else 'FAIL'})" for g in row["gates"]))
    return results


def _pilot_stage_a(config, out: Path, seed: int) -> dict:
    from qkplast.train.loop import train_arm

    return train_arm(config, out, seed, "stageA")


def _summary(record: dict) -> dict:
    keep = ("seed", "arm", "rope_theta", "branches", "device", "device_name", "wall_s", "tokens_per_s")
    return {k: record[k] for k in keep if k in record}


def baseline(out: Path, config) -> dict:
    """The held-out unigram and bigram cross-entropies of the training data in ``out`` (the gates' reference).

    Computed once per bench from the shared data every pilot and the full run copy (they differ only in
    optimisation settings), and passed to whatever reads it."""
    from qkplast.train.data import load_data
    from qkplast.train.gates import heldout_bigram_baseline

    data = load_data(out)
    return heldout_bigram_baseline(data.stream, data.heldout_stream.reshape(-1, config.window), config.vocab_size)


def pilot_gates(config, out: Path, record: dict, settings, gate_config, reference: dict, seed: int = 0) -> dict:
    """The stage-A gates of a pilot seed's final checkpoint (measured at L) and the pilot's tokens/s."""
    from qkplast.train.evaluate import measure_checkpoint
    from qkplast.train.gates import LEARNING_GATES, seed_gates
    from qkplast.train.hub import branch_name

    branch = branch_name("stageA", config.steps)
    row = measure_checkpoint(out, seed, branch, config.window, settings, stage_window=config.window)
    row.update(seed=seed, arm="stageA", step=config.steps, window=config.window)
    gated = seed_gates([row], reference["bigram"], config.vocab_size, config.window, gate_config).iloc[0]
    return {"tokens_per_s": float(record.get("tokens_per_s", float("nan"))), "loss": row["loss"],
            "gates": [{"gate": g, "value": float(gated[g]), "threshold": float(gated[f"{g}_threshold"]),
                       "passed": bool(gated[f"{g}_pass"])} for g in LEARNING_GATES]}


def gate_table(table, config, gate_config, reference: dict):
    """Every checkpoint's gates (:func:`qkplast.train.gates.seed_gates`) with the registered rule's columns."""
    from qkplast.train.evaluate import decisive_steps
    from qkplast.train.gates import registered_gates, seed_gates

    gates = seed_gates(table, reference["bigram"], config.vocab_size, config.window, gate_config)
    registered = registered_gates(gates, decisive_steps(config))
    return gates.assign(registered_passed=registered.passed.values, registered_failed=registered.failed.values)


def full_directory(out: Path, chosen: str, passed) -> Path:
    """Where the full run trains: a pilot that passed is the full setting on some of its seeds, so its directory
    (stage A of those seeds done, the same config recorded) continues as the full run's; else ``out/full``."""
    return out / f"pilot-{chosen}" if passed else out / "full"


def choose(pilots, results):
    """The first pilot (file order) all of whose seeds passed every stage-A gate; else the first pilot (the run is
    then read as "not testable" by the chapter, with the pilots' evidence)."""
    for name, config, _ in pilots:
        mine = [r for r in results if r["name"] == name]
        if mine and all(g["passed"] for r in mine for g in r["gates"]):
            return name, config, True
    return pilots[0][0], pilots[0][1], False


def export(out: Path, target: Path, config, training: dict, table, gates, provenance: dict, reference: dict) -> None:
    """The files chapter 10 reads (``data/miniature-full/``) into ``target``: those of
    :func:`qkplast.train.evaluate.save_full_run`, every gate per seed (``gates.csv``) and seed 0's checkpoints
    that the chapter recaptures (:func:`qkplast.train.shipped.shipped_branches`)."""
    from qkplast.train.evaluate import save_full_run
    from qkplast.train.shipped import SHIPPED, shipped_branches

    save_full_run(target, training, table, reference, provenance)
    gates.to_csv(target / "gates.csv", index=False)
    ship_seed(out, 0, target / SHIPPED, shipped_branches(config, table, reference["unigram"], 0))


def ship_seed(out: Path, seed: int, path: Path, names=None) -> None:
    """Checkpoints ``names`` of ``seed`` (None: every one) in float16 (safetensors, config and tokenizer), one
    folder per branch, packed by :func:`qkplast.train.shipped.pack_folders`."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from qkplast.train.hub import branches, hub_cache, repo_id, snapshot
    from qkplast.train.model import quiet_loading
    from qkplast.train.shipped import pack_folders

    staging = out / f"ship-seed{seed}"
    shutil.rmtree(staging, ignore_errors=True)
    names = sorted(names or branches(hub_cache(out), repo_id(seed)))
    with quiet_loading():
        for branch in names:
            folder = snapshot(hub_cache(out), repo_id(seed), branch)
            LlamaForCausalLM.from_pretrained(folder, dtype=torch.float16).save_pretrained(staging / branch)
            # the checkpoint's own tokenizer: a bos training's puts <|endoftext|> in front of a text
            AutoTokenizer.from_pretrained(folder, local_files_only=True).save_pretrained(staging / branch)
    pack_folders(staging, path, names)
    say(f"shipped seed {seed}'s {len(names)} checkpoints in float16: {path.stat().st_size / 2**20:.1f} MiB")


def repack(archive: Path, target: Path) -> None:
    """``target/seed0-checkpoints.tar.xz`` from ``archive``, an archive of every checkpoint of seed 0 (as an
    earlier export wrote it): the subset :func:`qkplast.train.shipped.shipped_branches` names for the full run in
    ``target``."""
    import tempfile

    from qkplast.train.evaluate import load_full_run
    from qkplast.train.shipped import SHIPPED, pack_folders, shipped_branches

    full = load_full_run(target)
    names = shipped_branches(full["config"], full["table"], full["baseline"]["unigram"], 0)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        missing = [n for n in names if not (Path(tmp) / n).is_dir()]
        if missing:
            raise SystemExit(f"{archive} lacks checkpoints {missing}; pass the archive of every checkpoint of seed 0")
        pack_folders(Path(tmp), target / SHIPPED, names)
    say(f"repacked {len(names)} checkpoints ({', '.join(names)}): {(target / SHIPPED).stat().st_size / 2**20:.1f} MiB")


def device_facts(device: str) -> dict:
    import platform

    import torch
    import transformers

    facts = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
             "python": platform.python_version(), "cpu": _cpu_name(), "commit": os.environ.get("QKPLAST_COMMIT") or _git_commit()}
    if device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(0)
    return facts


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", type=Path, default=FULL, help="the full setting's study file")
    parser.add_argument("--pilots", type=Path, default=PILOTS, help="the pilots file (settings over the full study's)")
    parser.add_argument("--out", type=Path, default=None, help="working directory (trainings, data, measurements)")
    parser.add_argument("--export", type=Path, default=None, help="write chapter 10's data files here")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--measure-workers", type=int, default=None, help="processes measuring checkpoints")
    parser.add_argument("--selftest-cpu", action="store_true", help="tiny settings on the CPU (rehearsal)")
    parser.add_argument("--skip-pilots", action="store_true", help="train the full study file's setting as it is")
    parser.add_argument("--pilot-names", nargs="+", default=None, metavar="NAME", help="only these pilots of --pilots")
    parser.add_argument("--pilots-only", action="store_true",
                        help="stop after the pilots (their gates written to --export DIR/pilots.json)")
    parser.add_argument("--require-pass", action="store_true",
                        help="stop after the pilots, as --pilots-only does, unless one of them passed every gate")
    parser.add_argument("--repack", type=Path, default=None, metavar="ARCHIVE",
                        help="only write --export's shipped checkpoints from ARCHIVE (every checkpoint of seed 0)")
    args = parser.parse_args(argv)
    if args.repack is not None:
        if args.export is None:
            parser.error("--repack needs --export DIR, the exported full run whose checkpoints it ships")
        repack(args.repack, args.export)
        return 0
    return run(args)


def run(args) -> int:
    import torch

    if args.out is None:
        raise SystemExit("bench_miniature: --out DIR is required (the working directory of the trainings)")

    from qkplast.train.config import load_train_study
    from qkplast.train.data import prepare_data
    from qkplast.train.evaluate import MeasureSettings, checkpoint_table
    from qkplast.train.gates import GateConfig
    from qkplast.train.run import train

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    facts = device_facts(device)
    say(f"bench_miniature on {facts.get('gpu', facts['cpu'])}, torch {facts['torch']}, commit {facts['commit']}")
    study = load_train_study(args.full)
    base = replace(study.config, device=device)
    overrides = {}
    if args.selftest_cpu:
        overrides = dict(layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, ffn=128, vocab_size=512, max_docs=60,
                         heldout_every=10, window=64, batch=8, steps=60, warmup=5, ext_steps=12, checkpoints=3,
                         ext_checkpoints=2, seeds=2, workers=2)
        base = replace(base, **overrides)
    workers = args.measure_workers or (min(16, os.cpu_count() or 2) if device == "cuda" else 2)
    settings = MeasureSettings(docs=4 if args.selftest_cpu else 16, device=device)
    gate_config = GateConfig()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    data_dir = out / "shared"
    say(f"1/5 data: corpus {base.corpus}, vocabulary {base.vocab_size}")
    prepare_data(base, data_dir)
    reference = baseline(data_dir, base)
    pilots = [] if args.skip_pilots else [(n, replace(c, **overrides), seeds)
                                          for n, c, seeds in load_pilots(args.pilots, base, args.pilot_names)]
    results, chosen, passed = [], "full study file", None
    config = base
    if pilots:
        say(f"2/5 pilots: {', '.join(f'{n} (seeds {s})' for n, _, s in pilots)}, stage A, side by side")
        measure = lambda c, d, record, seed: pilot_gates(c, d, record, settings, gate_config, reference, seed)  # noqa: E731
        results = run_pilots(pilots, data_dir, out, device, measure)
        chosen, config, passed = choose(pilots, results)
        say(f"   chosen: {chosen} ({'passed every stage-A gate' if passed else 'no pilot passed every gate: the first'})")
        if args.pilots_only or (args.require_pass and not passed):
            record = {**facts, "pilots": results, "chosen_pilot": chosen, "chosen_passed": passed,
                      "measure_settings": settings.__dict__, "gate_config": gate_config.__dict__,
                      "baseline": reference,
                      "total_s": round(time.perf_counter() - START, 1), "selftest_cpu": bool(args.selftest_cpu)}
            target = args.export or out
            target.mkdir(parents=True, exist_ok=True)
            (target / "pilots.json").write_text(json.dumps(record, indent=1, default=str))
            why = "pilots only" if args.pilots_only else "no pilot passed (--require-pass)"
            say(f"{why}: {target / 'pilots.json'}; done in {time.perf_counter() - START:.0f} s")
            return 0
    full_dir = full_directory(out, chosen, passed)
    shared_data(config, data_dir, full_dir)
    say(f"3/5 full run: {config.seeds} seeds x (stage A + {len(config.arms)} arms) on {device}, {config.workers} at once")
    tic = time.perf_counter()
    training = train(config, full_dir, progress=False)
    train_s = time.perf_counter() - tic
    rate = sum(r.get("tokens_per_s", 0) for r in training["runs"]) / max(len(training["runs"]), 1)
    say(f"   trained in {train_s:.0f} s ({rate:.0f} tok/s per run in the mean)")
    say(f"4/5 measuring every checkpoint at L and 4L ({settings.docs} documents each), {workers} processes")
    tic = time.perf_counter()
    table = checkpoint_table(full_dir, config, training, settings, workers=workers, progress=False)
    measure_s = time.perf_counter() - tic
    gates = gate_table(table, config, gate_config, reference)
    say(f"   measured {len(table)} rows in {measure_s:.0f} s")
    from qkplast.train.evaluate import decisive_steps
    from qkplast.train.gates import GATES

    for arm, steps in decisive_steps(config).items():
        for step in steps:
            for r in gates[(gates.arm == arm) & (gates.step == step)].itertuples():
                checks = [f"{g} {getattr(r, g):.3f} {'ok' if getattr(r, f'{g}_pass') else 'FAIL'}" for g in GATES
                          if getattr(r, f"{g}_pass") is not None]
                say(f"   seed {r.seed} {arm}@{step}: " + ", ".join(checks))
    say(f"   seeds passing the registered gates: {sorted(set(gates.seed) - set(gates.seed[~gates.registered_passed]))}")
    provenance = {**facts, "config": config.to_dict(), "chosen_pilot": chosen, "chosen_passed": passed,
                  "pilots": results, "train_s": round(train_s, 1), "measure_s": round(measure_s, 1),
                  "measure_settings": settings.__dict__, "gate_config": gate_config.__dict__,
                  "total_s": round(time.perf_counter() - START, 1), "selftest_cpu": bool(args.selftest_cpu)}
    if args.export is not None:
        say(f"5/5 export to {args.export}")
        export(full_dir, args.export, config, training, table, gates, provenance, reference)
    say(f"done in {time.perf_counter() - START:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
