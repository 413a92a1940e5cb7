#!/usr/bin/env bash
# On the build machine, before the device call of bench/python_gpu_check.sh: copies vLLM's Triton
# ops (../shared/peer, its README) into .peer/ and downloads the pinned build requirements of
# pyproject.toml (pure-Python wheels) into .pydeps/; both folders are git-ignored, so the device
# call names them in its carry: [".peer", ".pydeps"].
set -euo pipefail
cd "$(dirname "$0")/.."
peer="${M3SA_PEER_SOURCE:-../shared/peer}"
if [ -d "$peer" ]; then
  rm -rf .peer && cp -r "$peer" .peer && echo "copied $peer to .peer/"
else
  echo "no peer at $peer: the vLLM comparisons will skip" >&2
fi
requires=$(python3 -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))")
rm -rf .pydeps && mkdir .pydeps
# shellcheck disable=SC2086 # a list of requirements
python3 -m pip download -q --no-deps --only-binary=:all: -d .pydeps $requires
ls -l .pydeps
