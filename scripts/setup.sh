#!/usr/bin/env bash
# Create (or reuse) .venv and install flopwise with everything its tests need.
#
# A second run with nothing changed installs nothing: .venv/.flopwise-setup holds a hash
# of pyproject.toml and this script, written only after a complete install.
#
# torch is installed first and on purpose: a plain `torch` requirement pulls a
# multi-GB CUDA build. Without an NVIDIA GPU we ask the CPU wheel index first (short
# timeout) and fall back to the default index when it cannot be reached (as on this
# project's CI, whose default index serves a local CPU wheel).
#   FLOPWISE_TORCH   pip arguments for torch, e.g.
#                    "torch --index-url https://download.pytorch.org/whl/cu128"
#   PYTHON           interpreter for the venv (default python3, >= 3.10)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
STAMP=.venv/.flopwise-setup

wanted_stamp() {
  cat pyproject.toml scripts/setup.sh | "$PY" -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
}

torch_build() {
  .venv/bin/python -W ignore -c "import torch; print(f'torch {torch.__version__}, ' + (f'CUDA {torch.version.cuda}' if torch.version.cuda else 'CPU only'))" 2>/dev/null
}

WANTED=$(wanted_stamp)
if [ -x .venv/bin/python ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANTED" ] \
    && .venv/bin/python -c "import flopwise" 2>/dev/null; then
  echo "setup: .venv is up to date (pyproject.toml and scripts/setup.sh unchanged); nothing to install"
  exit 0
fi

if ! "$PY" -c "import sys; sys.exit(sys.version_info < (3, 10))" 2>/dev/null; then
  echo "setup: $PY is $("$PY" --version 2>&1); flopwise needs Python >= 3.10 (set PYTHON=python3.11)" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
rm -f "$STAMP"
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${FLOPWISE_TORCH:-}" ]; then
    echo "setup: installing torch from FLOPWISE_TORCH=$FLOPWISE_TORCH"
    # shellcheck disable=SC2086
    "${PIP[@]}" install $FLOPWISE_TORCH
  elif command -v nvidia-smi >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found; installing the default (CUDA) torch build"
    "${PIP[@]}" install torch
  elif .venv/bin/python -c "import urllib.request; urllib.request.urlopen('$CPU_INDEX/torch/', timeout=5)" 2>/dev/null; then
    echo "setup: no NVIDIA GPU; installing torch==$TORCH_VERSION from the CPU wheel index ($CPU_INDEX)"
    "${PIP[@]}" install --timeout 30 "torch==$TORCH_VERSION" --index-url "$CPU_INDEX"
  else
    echo "setup: no NVIDIA GPU and $CPU_INDEX cannot be reached; installing torch==$TORCH_VERSION from the default index"
    "${PIP[@]}" install "torch==$TORCH_VERSION"
  fi
fi
echo "setup: $(torch_build)"
"${PIP[@]}" install -e ".[all,test]"
echo "$WANTED" > "$STAMP"
echo "setup: .venv ready ($(torch_build))"
