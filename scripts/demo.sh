#!/usr/bin/env bash
# Sets up .venv if needed, then runs the end-to-end demo on data it generates in demo_data/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
