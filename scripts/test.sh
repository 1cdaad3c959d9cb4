#!/usr/bin/env bash
# Run every test, all tiers: unit (unmarked), integration, acceptance, and the notebooks' nbval regression.
# Arguments go to pytest. Fast path, unit tests only (a minute or two):
#   bash scripts/test.sh -m "not integration and not acceptance"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# OMP_WAIT_POLICY=PASSIVE: with spinning OpenMP waits a forward pass runs 10x slower whenever another
# process (a notebook kernel beside pytest) is busy on this 2-core machine.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE
nb=()
if compgen -G "notebooks/*.ipynb" >/dev/null; then
  nb=(--nbval notebooks --nbval-sanitize-with notebooks/sanitize.cfg)
fi
# --durations: the slowest tests are listed in every CI log, so the ~25-minute budget can be watched.
.venv/bin/python -m pytest tests "${nb[@]}" --durations=30 "$@"
