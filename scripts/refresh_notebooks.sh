#!/usr/bin/env bash
# Re-execute every notebook in place with its default parameters, so the committed .ipynb outputs
# (what the notebooks' regression compares against) come from the defaults. Run after editing a notebook's .py file.
set -euo pipefail
cd "$(dirname "$0")/.."
# OMP_WAIT_POLICY=PASSIVE: with spinning OpenMP waits a forward pass runs 10x slower whenever another
# process (a notebook kernel beside pytest) is busy on this 2-core machine.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE PYDEVD_DISABLE_FILE_VALIDATION=1
.venv/bin/jupytext --sync notebooks/[0-9][0-9]_*.py
for nb in notebooks/[0-9][0-9]_*.ipynb; do
  echo "[refresh] $nb"
  .venv/bin/papermill --cwd notebooks --kernel python3 --no-progress-bar "$nb" "$nb"
done
