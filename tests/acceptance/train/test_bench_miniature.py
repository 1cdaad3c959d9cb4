"""The full run's command rehearsed on the CPU (issue 36): ``benchmarks/bench_miniature.py --selftest-cpu`` runs
the pilots, chooses by the committed rule, trains every seed and arm, measures every checkpoint at both windows,
gates them and exports what chapter 10 reads; chapter 10 then reads that export as it would read the committed
``data/miniature-full/``."""

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pandas as pd
import pytest

from qkplast.train.evaluate import load_full_run
from qkplast.train.gates import GATES

from tests.helpers import ROOT


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
       "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def base_pilot(tmp_path_factory):
    """``--selftest-cpu --pilot-names base --require-pass``: the "base" pilot of seed 0 trained once for the file (it
    fails its gates, so the command stops before the full run); the other tests start from a copy of its folder,
    where that pilot's training is finished and is read, not trained again."""
    work = tmp_path_factory.mktemp("miniature") / "work"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_miniature.py"), "--selftest-cpu",
                           "--pilot-names", "base", "--require-pass", "--out", str(work)],
                          capture_output=True, text=True, env=ENV, timeout=900)
    return work, done


def _from_base_pilot(base_pilot, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(base_pilot[0], work)
    return work


def test_the_full_run_command_exports_what_chapter_10_reads(base_pilot, tmp_path):
    export = tmp_path / "export"
    env = ENV
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_miniature.py"), "--selftest-cpu",
                           "--pilot-names", "base", "bos", "--out", str(_from_base_pilot(base_pilot, tmp_path)),
                           "--export", str(export)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    # the two pilots named, each on the seeds studies/miniature-pilots.yaml gives it, with its gates
    for pilot, seeds in (("base", [0]), ("bos", [0, 1, 2, 3])):
        assert all(f"pilot {pilot} seed {seed}:" in out for seed in seeds) and "tok/s" in out
    assert "pilot lr-6e-3" not in out and "chosen:" in out and "seeds passing the registered gates" in out
    run = load_full_run(export)
    provenance = run["provenance"]
    assert provenance["device"] == "cpu" and provenance["selftest_cpu"] and len(provenance["pilots"]) == 5
    assert provenance["baseline"]["bigram"] < provenance["baseline"]["unigram"]
    table, config = run["table"], run["config"]
    assert set(table.window_kind) == {"L", "4L"} and set(table.seed) == set(range(config.seeds))
    # every checkpoint of every run measured at both windows
    per_run = table.groupby(["seed", "arm", "step"]).window_kind.nunique()
    assert (per_run == 2).all() and len(per_run) == sum(len(r["branches"]) for r in run["training"]["runs"])
    gates = pd.read_csv(export / "gates.csv")
    assert {f"{g}_pass" for g in GATES} <= set(gates.columns) and "registered_passed" in gates
    with tarfile.open(export / "seed0-checkpoints.tar.xz") as tar:
        names = {n.split("/")[0] for n in tar.getnames()}
    branches = json.loads((export / "training.json").read_text())["runs"][0]["branches"]
    # seed 0's decisive checkpoints (the branch, stage A's end, each arm's end), in float16
    assert {f"stageA-step{config.steps}", f"stageA-step{config.ext_start}"} <= names <= set(branches) | {
        f"ext-{arm}-step{config.ext_steps}" for arm in config.arms}
    assert {f"ext-{arm}-step{config.ext_steps}" for arm in config.arms} <= names

    executed = tmp_path / "10.ipynb"
    done = subprocess.run([sys.executable, "-m", "papermill", "--cwd", str(ROOT / "notebooks"), "--kernel", "python3",
                           "--no-progress-bar", str(ROOT / "notebooks" / "10_results_training.ipynb"), str(executed),
                           "-p", "full_run", str(export), "-p", "run_dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env={**env, "QKPLAST_CACHE": str(tmp_path / "cache")},
                          timeout=600)  # a cache of its own: the export is measured here, never read back
    assert done.returncode == 0, done.stderr[-3000:]
    text = executed.read_text()
    assert "the committed full run" in text and "seeds that pass every registered gate" in text
    # the shipped checkpoints recaptured on this CPU (their tolerance is checked on the committed run, in
    # tests/integration/train/test_shipped.py: two untrained seeds of the rehearsal barely differ from each other)
    assert "checkpoints x 2 windows x 8 quantities recaptured" in text
    assert "measured on this machine" in text and "read back: measured" not in text
    assert len(list((tmp_path / "cache" / "recapture").glob("*.json"))) == 1  # kept for the next build
    assert not (tmp_path / "run").exists()  # the full run is read, nothing trained


WRAPPER = """
import sys
sys.path.insert(0, {benchmarks!r})
import bench_miniature

# the selftest's tiny pilots cannot pass the gates: pretend the first one did, to rehearse what follows a pass
bench_miniature.choose = lambda pilots, results: (pilots[0][0], pilots[0][1], True)
if __name__ == "__main__":  # the spawned workers import this file again
    sys.exit(bench_miniature.main(sys.argv[1:]))
"""


def test_a_pilot_that_passed_continues_as_the_full_run_in_its_own_directory(base_pilot, tmp_path):
    """The chosen pilot is the full setting on some of its seeds: its stage A is not trained again."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER.format(benchmarks=str(ROOT / "benchmarks")))
    work = _from_base_pilot(base_pilot, tmp_path)
    done = subprocess.run([sys.executable, str(wrapper), "--selftest-cpu", "--pilot-names", "base", "--require-pass",
                           "--out", str(work)], capture_output=True, text=True, env=ENV, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the full run trained in the pilot's directory, where seed 0's stage A was already done (train_arm returns a
    # finished run's record at once), and nowhere else
    assert "3/5 full run" in done.stdout and not (work / "full").exists()
    training = json.loads((work / "pilot-base" / "training.json").read_text())
    assert {(r["seed"], r["arm"]) for r in training["runs"]} == {
        (seed, arm) for seed in (0, 1) for arm in ("stageA", "rescaled", "control", "rescaled-short")}


def test_require_pass_stops_after_pilots_that_failed(base_pilot):
    work, done = base_pilot
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no pilot passed (--require-pass)" in done.stdout and "3/5 full run" not in done.stdout
    record = json.loads((work / "pilots.json").read_text())
    assert record["chosen_passed"] is False and [p["name"] for p in record["pilots"]] == ["base"]
