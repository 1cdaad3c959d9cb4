"""What the interventions chapter adds to the book build: the notebook stage with and without it, side by side.

Issue 11's budget: chapter 12 ("Beyond the thesis: interventions") adds at
most 4 minutes to the default book build on 2 cores. The book build
(``scripts/book.sh``) runs ``qkplast run --jobs 2``: captures, analyses, then
the notebooks, two kernels at once, the slowest first. This script copies a
finished default run (its captures, analyses and bootstrap, as the build has
made them before the notebooks start) into two fresh directories and runs the
notebook stage of each with ``--jobs 2``: once with every notebook, once
without chapter 12. Everything chapter 12 computes (its clamp calibrations, the
behaviour grid, the re-captures) is absent from both copies, as in a fresh
build; chapter 13's condition captures are absent too, so both runs make them.
The difference of the two wall times is what the chapter adds to the build.

    python benchmarks/bench_chapter_budget.py [--run runs/smollm2-135m] [--work /tmp/qkplast-chapter-budget]

``--run`` must hold a finished default run (``bash scripts/book.sh`` or
``qkplast run --stage analyze``). Takes about 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from qkplast.pipeline.params import notebook_paths
from qkplast.pipeline.stages import run

CHAPTER = "12_interventions"
BUDGET_S = 240
#: what the notebook stage reads before any notebook runs: the captures, analyses and bootstrap of the run
FINISHED = ("capture.nc", "metrics.nc", "bootstrap.nc", "manifest.json", "code")


def fresh_copy(run_dir: Path, target: Path) -> Path:
    """``target`` holding the run's captures and analyses, no executed notebook and nothing a notebook cached."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in FINISHED:
        src = run_dir / name
        if src.is_dir():
            shutil.copytree(src, target / name, ignore=shutil.ignore_patterns("notebooks"))
        elif src.exists():
            shutil.copy2(src, target / name)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["notebooks"] = []
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return target


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/smollm2-135m", help="a finished default run directory")
    ap.add_argument("--work", default="/tmp/qkplast-chapter-budget", help="scratch directory for the two copies")
    ap.add_argument("--jobs", type=int, default=2, help="notebook kernels at once (the book build uses 2)")
    args = ap.parse_args()
    run_dir = Path(args.run).resolve()
    missing = [n for n in ("capture.nc", "metrics.nc", "manifest.json") if not (run_dir / n).exists()]
    if missing:
        raise SystemExit(f"error: {run_dir} is not a finished run (missing {', '.join(missing)}); "
                         "run 'bash scripts/book.sh' or 'qkplast run --stage analyze' first")
    seconds = {}
    for label, keep in (("without chapter 12", lambda p: p.stem != CHAPTER), ("every notebook", lambda p: True)):
        target = fresh_copy(run_dir, Path(args.work) / label.replace(" ", "-"))
        notebooks = [p for p in notebook_paths() if keep(p)]
        t0 = time.perf_counter()
        run(out=target, notebooks=notebooks, jobs=args.jobs, progress=True)
        seconds[label] = time.perf_counter() - t0
        print(f"[bench] notebook stage, {label} ({len(notebooks)} notebooks, --jobs {args.jobs}): "
              f"{seconds[label]:.1f} s", flush=True)
    added = seconds["every notebook"] - seconds["without chapter 12"]
    print(f"\n{'notebook stage':32s} {'wall (s)':>9s}")
    for label, s in seconds.items():
        print(f"{label:32s} {s:9.1f}")
    print(f"{'chapter 12 adds':32s} {added:9.1f}   budget {BUDGET_S} s: {'met' if added <= BUDGET_S else 'NOT met'}")


if __name__ == "__main__":
    main()
