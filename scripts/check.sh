#!/usr/bin/env bash
# Code checks: ruff (lint and format) and mypy, as configured in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check autotune tests benchmarks scripts
.venv/bin/ruff format --check autotune tests benchmarks scripts
.venv/bin/mypy
