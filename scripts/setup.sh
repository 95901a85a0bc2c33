#!/usr/bin/env bash
# Create (or reuse) .venv and install flopwise with everything its tests need.
#
# torch is installed first and on purpose: a plain `torch` requirement pulls a
# multi-GB CUDA build. On a machine without an NVIDIA GPU we ask for the CPU build.
#   FLOPWISE_TORCH   pip arguments for torch, e.g.
#                    "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
#                    or "torch --index-url https://download.pytorch.org/whl/cu128"
#   PYTHON           interpreter for the venv (default python3, >= 3.10)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${FLOPWISE_TORCH:-}" ]; then
    # shellcheck disable=SC2086
    "${PIP[@]}" install $FLOPWISE_TORCH
  elif command -v nvidia-smi >/dev/null 2>&1; then
    "${PIP[@]}" install torch
  else
    "${PIP[@]}" install "torch==2.13.0"
  fi
fi
"${PIP[@]}" install -e ".[all,test]"
