#!/usr/bin/env bash
# Run every test: the package's pytest suite and the notebooks' nbval regression.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nb=()
if compgen -G "notebooks/*.ipynb" >/dev/null; then
  nb=(--nbval notebooks --nbval-sanitize-with notebooks/sanitize.cfg)
fi
.venv/bin/python -m pytest tests "${nb[@]}" "$@"
