#!/usr/bin/env bash
# Run the tests. Four tiers: tests/unit (seconds, no model, no subprocess), tests/integration (tiny or embedded
# models, notebook kernels, several modules), tests/acceptance (end to end: CLI, batches, the book in a browser,
# a SLURM cluster) and the notebooks' regression (notebooks/: every committed chapter's cells against the book's
# own execution of the default run, `qkplast run --out runs/smollm2-135m --jobs 2` as scripts/book.sh makes it,
# by nbval's rules; tests/book_regression.py). The book's measured times: book/reproduce.md.
#   bash scripts/test.sh                  every tier: pytest tests notebooks, two workers (-n 2)
#   bash scripts/test.sh tests/unit       the fast path: the unit tier only, no notebook
#   bash scripts/test.sh ARGS...          pytest with ARGS, two workers (-n 0 in ARGS: one process) (notebooks/NN_x.ipynb: that chapter's regression,
#                                         the run reusing every chapter already executed with the same source)
# First it installs what the tests need: the Python environment (scripts/setup.sh) and, when missing, Debian's
# chromium + chromium-driver (the book in a browser) and slurm-wlm + munge (the study on a SLURM cluster): as root
# with apt-get, otherwise it says which apt-get to run and goes on (the tests that need a missing package then fail
# or skip naming it). The corpora are shipped snapshots (data/corpora): no Debian package is read.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_debian.sh
missing=$(test_packages_missing)
apt_job=
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086  # one word per package
  apt_install false $missing &  # beside the Python install: one waits on the network while the other unpacks
  apt_job=$!
fi
bash scripts/setup.sh
if [ -n "$apt_job" ] && ! wait "$apt_job"; then
  echo "[test] going on without Debian package(s) $missing: the tests that need them fail or skip" >&2
fi
# OMP_WAIT_POLICY=PASSIVE: with spinning OpenMP waits a forward pass runs 10x slower whenever another
# process (a notebook kernel beside pytest) is busy on this 2-core machine.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE
# Bytecode is written (an environment may set PYTHONDONTWRITEBYTECODE): the run starts a few hundred Python
# processes (notebook kernels, CLI calls, pytest's workers), and without a cache each compiles qkplast's modules
# again, about 0.15 s of importing the CLI's modules here.
unset PYTHONDONTWRITEBYTECODE
if [ $# -eq 0 ]; then set -- tests notebooks; fi
# Two pytest workers (pytest-xdist), for every tier and for ARGS too (the unit tier alone: 1100 tests, about 140 s of
# test time): the book's run (and the tests that read it) in one while the other tests run in the other beside it;
# tests/conftest.py groups what must share a worker. QKPLAST_TEST_WORKERS=0 runs in one process; a -n in ARGS
# comes after these and wins.
n="${QKPLAST_TEST_WORKERS:-2}"
workers=()
if [ "$n" -gt 0 ]; then workers=(-n "$n" --dist loadgroup --no-loadscope-reorder); fi
.venv/bin/python -m pytest "${workers[@]}" "$@" --durations=30
