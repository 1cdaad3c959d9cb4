#!/usr/bin/env bash
# Build the companion book end to end and print where the HTML is.
#   bash scripts/book.sh               the book of the default run (qkplast.CaptureOptions defaults)
#   bash scripts/book.sh STUDY.yaml    the cross-model book: every run of the study is captured and analysed
#                                      (qkplast study --stage analyze, local executor, resumable), the
#                                      notebooks run on the study's first run and their results chapters
#                                      read every run (notebook parameter `study`)
# The default run: SmolLM2-135M across its whole trained window, single documents of 8192 tokens from the
# CPython documentation (corpus python-docs, the snapshot pinned in data/corpora), 16 buckets of 512 tokens, plus the
# same capture on the standard library's code (stdlib-code, pinned likewise) for notebook 09; one model load for both.
# Steps: install (.venv) -> captures -> analyses -> papermill batch -> Jupyter Book HTML.
# The measured duration is in README.md ("The two commands"); a rerun reuses the install, the captures, the
# analyses and the executed notebooks.
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
  echo "[book] building the cross-model book of $study; each run costs a capture and an analysis, then the notebooks run once"
else
  echo "[book] building the companion book of the default run; see README.md for the measured duration"
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
  "$venv/bin/python" -c "import sys; from qkplast.pipeline.book import book_notebooks; book_notebooks(sys.argv[1], 'book/notebooks')" "$study"
else
  step "2/4 captures (progress per document), analyses and notebooks of the default run (qkplast run)"
  # --jobs 2: two notebook kernels at once, so one's single-threaded parts (start, imports, tables, figures)
  # overlap the other's work on the 2 cores
  "$venv/bin/qkplast" run --out runs/smollm2-135m --jobs 2
  step "3/4 collecting the executed notebooks of the default run (papermill's injected cell folded into the parameters cell)"
  cp runs/smollm2-135m/notebooks/*.ipynb book/notebooks/
  "$venv/bin/python" -c "import sys; from qkplast.pipeline.book import fold_injected_parameters; [fold_injected_parameters(p) for p in sys.argv[1:]]" book/notebooks/*.ipynb
fi
step "4/4 HTML with Jupyter Book (warnings are errors)"
rm -rf _build/html
"$venv/bin/jupyter-book" build . --warningiserror --nitpick --keep-going --builder html
step "done: open $(pwd)/_build/html/index.html"
