#!/usr/bin/env bash
# GPU check of the paper profile's local models (random weights at full size, through our backends), for a
# GPU machine without network: Python 3.12 with torch, transformers and onnxruntime, nothing else of ours.
# One JSON file (benchmarks/results/gpu_check.json, or --out PATH); one command of under 8 minutes.
#   make gpu-wheels                         # once, where PyPI is reachable: .gpu-wheels/ (< 60 MiB)
#   bash benchmarks/gpu_check.sh            # on the GPU machine (the folder .gpu-wheels/ travels with the repo)
#   bash benchmarks/gpu_check.sh --dry-run  # tiny sizes on the CPU, same wheel install (what the tests run)
# The wheels are installed with pip --no-index --no-deps --target $GPU_SITE before the first import.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
WHEELS="${GPU_WHEELS:-$PWD/.gpu-wheels}"
LIST="${GPU_WHEEL_LIST:-$PWD/benchmarks/gpu_wheels.txt}"
SITE="${GPU_SITE:-${TMPDIR:-/tmp}/biasaudit-gpu-site}"
STRICT=--strict
for arg in "$@"; do [ "$arg" = "--dry-run" ] && STRICT=""; done
"$PY" benchmarks/gpu_wheels.py install --wheels "$WHEELS" --list "$LIST" --target "$SITE" $STRICT
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" GPU_SITE="$SITE"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PYTHONUNBUFFERED=1
exec timeout --signal=TERM 470 "$PY" benchmarks/gpu_check.py "$@"
