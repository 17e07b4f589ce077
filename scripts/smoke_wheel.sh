#!/usr/bin/env bash
# Builds the wheel and the sdist (python -m build), installs the wheel with the user extras into a
# fresh venv that has nothing but torch, and runs scripts/smoke_wheel.py there: what a user gets
# from `pip install torch` then `pip install megatron-energon-lite[av,s3]`, without the checkout,
# the dev package or Energon. Needs .venv (scripts/setup.sh) for `build` (DEV_PYTHON: another
# Python that has it); set TORCH_SPEC as there.
set -euo pipefail
# Only the installed wheel may be imported: a PYTHONPATH from the calling shell (a checkout, the
# dev package) would hide a missing file in the wheel.
unset PYTHONPATH
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
# Every example that runs on a CPU, on the small dataset it generates (megatron_core_gpt.py needs
# megatron-core and a GPU; tests/test_megatron_example.py covers its data path).
example() {
  local script=$1; shift
  "$work/venv/bin/python" "$repo/examples/$script" "$@" >"$work/example.log" 2>&1 || { cat "$work/example.log"; echo "smoke: examples/$script failed"; exit 1; }
}
# Each example in its own folder: two that generate a folder of the same name must not share it.
example text_packing.py --data-dir "$work/ex/text_packing" --workers 0 --batches 12 --seq-length 512
example aspect_ratio_grouping.py --data-dir "$work/ex/aspect" --images 30
example blend_mix.py --data-dir "$work/ex/blend_mix" --workers 0 --batches 20 --every 10 --mode exact
example elastic_resume.py --data-dir "$work/ex/elastic_resume" --samples 60
example video_qa.py --data-dir "$work/ex/video_qa" --samples 8 --workers 0
example audio_captioning.py --data-dir "$work/ex/audio_captioning" --samples 8 --workers 0
example video_aux.py --data-dir "$work/ex/video_aux" --samples 8 --clips 4 --batches 2 --workers 0
example demo.py --out "$work/ex/demo" --shards 2 --samples-per-shard 10 --batches 4
echo "smoke: the examples ran from the installed wheel"
echo "smoke: $(basename "$wheel") installed into a fresh venv and works"
