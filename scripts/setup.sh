#!/usr/bin/env bash
# Creates .venv (once) and installs the project with its test and oracle extras, plus the
# test/dev support package in dev/ (energon_lite_dev: synthetic datasets, a local S3 server) that
# the tests, examples and benchmarks import. Re-runs the install only when pyproject.toml,
# setup.py, the as_energon startup hook (megatron_energon_lite_as_energon.pth, which the install
# puts into site-packages) or dev/pyproject.toml changed. torch is installed first so that no
# dependency pulls a CUDA build; set TORCH_SPEC to pick another torch (GPU users).
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin=${PYTHON:-python3}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
    "$python_bin" -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml setup.py megatron_energon_lite_as_energon.pth dev/pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "$torch_spec"
    .venv/bin/python -m pip install -q -e ".[dev,av,s3,energon]"
    .venv/bin/python -m pip install -q --no-deps -e ./dev
    rm -f .venv/.installed-*
    touch "$stamp"
fi
# Chromium renders the HTML preview in one test (tests/preview/test_chromium.py). Installed from
# Debian's packages when missing and we may (root, apt-get); setup goes on without it.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 && ! command -v google-chrome >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
        && { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1; then
        :
    else
        echo "setup: chromium is missing and could not be installed (that needs root and apt-get); the HTML preview test will be skipped"
    fi
fi
