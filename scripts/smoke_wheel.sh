#!/usr/bin/env bash
# Builds the wheel and the sdist (python -m build), installs the wheel with the user extras into a
# fresh venv that has nothing but torch, and runs scripts/smoke_wheel.py there: what a user gets
# from `pip install torch` then `pip install megatron-energon-lite[av,s3]`, without the checkout,
# the dev package or Energon. Needs .venv (scripts/setup.sh) for `build` (DEV_PYTHON: another
# Python that has it); set TORCH_SPEC as there.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
torch_spec=${TORCH_SPEC:-torch==2.13.0}
python_bin=${PYTHON:-python3}
dev_python=${DEV_PYTHON:-.venv/bin/python}
work=$(mktemp -d "${TMPDIR:-/tmp}/energon-lite-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$dev_python" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)
# The sdist carries the sources and the type marker too.
tar -tzf "$sdist" | grep "megatron_energon_lite/py.typed" >/dev/null || { echo "smoke: py.typed missing from $sdist"; exit 1; }
"$python_bin" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$torch_spec"
"$work/venv/bin/python" -m pip install -q "$wheel[av,s3]"
# Run outside the checkout, so that only the installed package can be imported.
cd "$work"
"$work/venv/bin/python" "$repo/scripts/smoke_wheel.py" "$work" "$repo"
echo "smoke: $(basename "$wheel") installed into a fresh venv and works"
