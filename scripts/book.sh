#!/usr/bin/env bash
# Build the companion book end to end on the default run and print where the HTML is.
# The default run (qkplast.CaptureOptions defaults): SmolLM2-135M across its whole trained window, 4 single
# documents of 8192 tokens from the CPython documentation (Debian python3-doc), 16 buckets of 512 tokens,
# plus the same capture on the standard library's code for notebook 09; one model load for both.
# Steps: install (.venv, python3-doc) -> captures -> analyses -> papermill batch -> Jupyter Book HTML.
# Measured from a fresh clone (git clone; bash scripts/book.sh) on this project's 2-core machine while five
# other sessions shared it (load average 6-13): 33 min wall, of which install 9, captures 19 (prose 12,
# code 6), notebooks 5, HTML 5 s; the whole build used 13.3 min of CPU (user 11.5 + sys 1.9), so on an idle
# 2-core machine it takes between 7 and 13 minutes (CPU time / 2 to CPU time).
# A rerun reuses the install, the captures, the analyses and the executed notebooks (measured: 27 s).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
echo "[book] building the companion book; expect 7-13 minutes from scratch on an idle 2-core machine, under a minute on a rerun"
step() { echo "[book] $(( $(date +%s) - start ))s: $*"; }
step "1/4 install"
source scripts/_debian.sh
apt_install python_docs_present python3-doc
bash scripts/setup.sh
# OMP_WAIT_POLICY=PASSIVE: with spinning OpenMP waits a forward pass runs 10x slower whenever another
# process (a notebook kernel beside pytest) is busy on this 2-core machine.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE PYDEVD_DISABLE_FILE_VALIDATION=1
step "2/4 captures (progress per document), analyses and notebooks for smollm2-135m (qkplast run)"
.venv/bin/qkplast run --out runs/smollm2-135m
step "3/4 collecting the executed notebooks of the default run"
rm -rf book/notebooks && mkdir -p book/notebooks
cp runs/smollm2-135m/notebooks/*.ipynb book/notebooks/
step "4/4 HTML with Jupyter Book (warnings are errors)"
rm -rf _build/html
.venv/bin/jupyter-book build . --warningiserror --nitpick --keep-going --builder html
step "done: open $(pwd)/_build/html/index.html"
