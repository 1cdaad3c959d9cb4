#!/usr/bin/env bash
# Build the companion book end to end and print where the HTML is.
#   bash scripts/book.sh               the book of the embedded default model (one run)
#   bash scripts/book.sh STUDY.yaml    the cross-model book: every run of the study is captured and analysed
#                                      (qkplast study --stage analyze, local executor, resumable), the
#                                      notebooks run on the study's first run and their results chapters
#                                      read every run (notebook parameter `study`)
# Steps: install (.venv) -> capture(s) -> analyses -> papermill -> Jupyter Book HTML.
# Measured on a 2-core machine from a fresh clone: 6 minutes (install 1.5, capture 1, the 11 notebooks
# 3.5 of which the bootstraps take 2, HTML a few seconds); a rerun reuses the install, captures and bootstraps.
# QKPLAST_VENV=/path/to/venv uses an existing environment (with qkplast importable) and skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
study="${1:-}"
venv="${QKPLAST_VENV:-.venv}"
step() { echo "[book] $(( $(date +%s) - start ))s: $*"; }
if [ -n "$study" ] && [ ! -e "$study" ]; then
  echo "[book] error: study file $study does not exist (see studies/*.yaml)" >&2
  exit 2
fi
if [ -n "$study" ]; then
  echo "[book] building the cross-model book of $study; each run costs a capture and an analysis (about a minute each for the embedded model on 2 cores), then the notebooks run once (about 4 minutes)"
else
  echo "[book] building the companion book; expect about 6 minutes from scratch on 2 cores, 2-3 on a rerun"
fi
step "1/4 install"
if [ -z "${QKPLAST_VENV:-}" ]; then bash scripts/setup.sh; else echo "[book] using $venv (no install)"; fi
# OMP_WAIT_POLICY=PASSIVE: with spinning OpenMP waits a forward pass runs 10x slower whenever another
# process (a notebook kernel beside pytest) is busy on this 2-core machine.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE PYDEVD_DISABLE_FILE_VALIDATION=1
rm -rf book/notebooks && mkdir -p book/notebooks
if [ -n "$study" ]; then
  step "2/4 capture and analysis of every run of $study (qkplast study --stage analyze; finished runs are reused)"
  "$venv/bin/qkplast" study "$study" --executor local --stage analyze
  step "3/4 the notebooks on the study's first run, their results chapters reading every run"
  "$venv/bin/python" -c "import sys; from qkplast.crossrun import book_notebooks; book_notebooks(sys.argv[1], 'book/notebooks')" "$study"
else
  step "2/4 capture, analyses and notebooks for smollm2-135m (qkplast run; progress per notebook below)"
  "$venv/bin/qkplast" run --model smollm2-135m --out runs/smollm2-135m
  step "3/4 collecting the executed notebooks of the default run (papermill's injected cell folded into the parameters cell)"
  cp runs/smollm2-135m/notebooks/*.ipynb book/notebooks/
  "$venv/bin/python" -c "import sys; from qkplast.crossrun import fold_injected_parameters; [fold_injected_parameters(p) for p in sys.argv[1:]]" book/notebooks/*.ipynb
fi
step "4/4 HTML with Jupyter Book (warnings are errors)"
rm -rf _build/html
"$venv/bin/jupyter-book" build . --warningiserror --nitpick --keep-going --builder html
step "done: open $(pwd)/_build/html/index.html"
