#!/usr/bin/env bash
# The Python package's tests (called by scripts/run_tests.sh): builds the wheel CPU-only (the CUDA
# objects belong to the C++ build; M3SA_ENABLE_CUDA stays OFF here), installs it into a virtual
# environment kept under build/, and runs tests/python there, which also installs the wheel into a
# fresh environment. Build requirements come from pyproject.toml, so the pins live in one place.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/python-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
read_pyproject() { "$venv/bin/python" -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); print(' '.join($1))"; }
"$venv/bin/pip" install -q $(read_pyproject "p['build-system']['requires'] + p['project']['optional-dependencies']['test']")

rm -rf build/wheel
# --no-build-isolation: the pinned build requirements are in $venv, and build/python/ keeps the
# CMake build between runs (an unchanged tree rebuilds nothing).
M3SA_ENABLE_CUDA=OFF "$venv/bin/pip" wheel . -q -w build/wheel --no-build-isolation --no-deps
wheel=$(ls build/wheel/m3sa-*.whl)
"$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel"
M3SA_WHEEL="$PWD/$wheel" "$venv/bin/python" -m pytest -q tests/python
