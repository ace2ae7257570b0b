#!/usr/bin/env bash
# GPU check of the paper profile's local models (random weights at full size, through our backends).
# One JSON file ($OUT/gpu_check.json, or --out PATH); under 10 minutes on one GPU.
#   bash benchmarks/gpu_check.sh            # on a GPU box
#   bash benchmarks/gpu_check.sh --dry-run  # tiny sizes on the CPU (what the tests run)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
exec timeout --signal=TERM 570 "$PY" benchmarks/gpu_check.py "$@"
