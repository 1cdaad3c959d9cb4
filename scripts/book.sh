#!/usr/bin/env bash
# Build the companion book end to end on the embedded default model and print where the HTML is.
# Steps: install (.venv) -> capture on SmolLM2-135M -> analyses -> papermill batch -> Jupyter Book HTML.
# Measured on a 2-core machine from a fresh clone: 6 minutes (install 1.5, capture 1, the 11 notebooks
# 3.5 of which the bootstraps take 2, HTML a few seconds); a rerun reuses the install, captures and bootstraps.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
echo "[book] building the companion book; expect about 6 minutes from scratch on 2 cores, 2-3 on a rerun"
step() { echo "[book] $(( $(date +%s) - start ))s: $*"; }
step "1/4 install"
bash scripts/setup.sh
# OMP_WAIT_POLICY=PASSIVE: with spinning OpenMP waits a forward pass runs 10x slower whenever another
# process (a notebook kernel beside pytest) is busy on this 2-core machine.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE PYDEVD_DISABLE_FILE_VALIDATION=1
step "2/4 capture, analyses and notebooks for smollm2-135m (qkplast run; progress per notebook below)"
.venv/bin/qkplast run --model smollm2-135m --out runs/smollm2-135m
step "3/4 collecting the executed notebooks of the default run"
rm -rf book/notebooks && mkdir -p book/notebooks
cp runs/smollm2-135m/notebooks/*.ipynb book/notebooks/
step "4/4 HTML with Jupyter Book (warnings are errors)"
rm -rf _build/html
.venv/bin/jupyter-book build . --warningiserror --nitpick --keep-going --builder html
step "done: open $(pwd)/_build/html/index.html"
