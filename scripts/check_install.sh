#!/usr/bin/env bash
# autotune installed as a user installs it: non-editable (`pip install .`) into a fresh
# virtual environment, then `autotune profile --help` and a short profile of a tiny random
# model run from it (the search spaces must come from the installed package).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/autotune-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}
"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "${AUTOTUNE_TORCH:-torch==2.13.0}"
"${pip[@]}" .
cd "$work"   # away from the source tree: only the installed package is importable
venv/bin/autotune --version >/dev/null
venv/bin/autotune profile --help >/dev/null
venv/bin/python "$OLDPWD/scripts/tiny_model.py" "$work/tiny" >/dev/null
RAY_USAGE_STATS_ENABLED=0 venv/bin/autotune profile --model tiny/tiny-llama \
    --prompts tiny/prompts.jsonl --methods self_spec --search-space self_spec=tiny/self_spec.yaml \
    --time-budget 60 --heldback-prompts 2 --max-new-tokens 8 --threads 1 \
    --storage "sqlite:///$work/studies.db" --out "$work/profile.yaml"
venv/bin/autotune validate "$work/profile.yaml"
echo "check_install: the installed package profiled a tiny model"
