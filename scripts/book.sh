#!/usr/bin/env bash
# Build the companion book end to end on the embedded default model and print where the HTML is.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
echo "[book] building HTML with Jupyter Book (warnings are errors)"
rm -rf _build/html
.venv/bin/jupyter-book build . --warningiserror --nitpick --keep-going --builder html
echo "[book] done in $(( $(date +%s) - start )) s: open $(pwd)/_build/html/index.html"
