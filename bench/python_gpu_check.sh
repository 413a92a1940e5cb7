#!/usr/bin/env bash
# The Python package's GPU round, on the device machine, from the repository root, in one call:
#   builds and installs m3sa with its CUDA backend (sm_90a only, every core, only the extension's
#   targets), then runs tests/python (tests/python/test_gpu.py: opcheck, CUDA graphs, torch.compile,
#   DLPack with torch and cupy on a side stream, bad arguments, and m3sa.vllm against vLLM's Triton
#   ops from .peer/), bench/python_overhead.py (per-call overhead, JSON),
#   bench/python_import_time.py (import time of the installed package, JSON) and
#   bench/structured_attention.py (prefill attention on structured selections, m3sa vs vLLM, JSON).
#
# Prepare once on the build machine: `bash bench/python_gpu_prepare.sh` (copies ../shared/peer to
# .peer/ and the pinned build requirements' wheels to .pydeps/, both git-ignored), then on the device:
#   bash bench/python_gpu_check.sh            (run's carry: [".peer", ".pydeps"])
# Without .pydeps the device's own nanobind / scikit-build-core build it; without .peer the vLLM
# comparisons skip (M3SA_PEER_DIR overrides the folder).
# M3SA_PYTHON_STAGES: the stages after the build, a comma list of tests, overhead, import and
# structured (default: all four). "structured" alone is a kernel round's check of issue 11's
# structured target (~1.5 min); "tests,overhead" a Python-layer round's (~4 min).
#
# What comes back ($OUT, at most 8 files): summary.txt, pytest.xml, gpu_report.jsonl,
# python_overhead.json, python_import_time.json, structured_attention.json, logs.tgz (environment,
# build, pytest, overhead and structured-attention logs). Exit status: the first failing stage's.
# Expected: ~1 min build, ~2-3 min tests, ~30 s overhead, ~30 s import time, ~1-2 min structured
# attention.
set -uo pipefail
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 # device README
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/env.sh
source scripts/env.sh # nvcc on PATH where the toolkit is installed but not on PATH
out="${OUT:-/tmp/m3sa_python_gpu}"
logs="$out/logs"
mkdir -p "$logs"
py="${PYTHON:-python3}"
jobs="$(nproc)"
t0=$SECONDS
rc=0
summary() { echo "$*" | tee -a "$out/summary.txt"; }
stage() { summary "== $1 (t=$((SECONDS - t0)) s)"; }
finish() {
  summary "== done (t=$((SECONDS - t0)) s), rc=$rc"
  (cd "$out" && tar czf logs.tgz logs && rm -rf logs)
  exit "$rc"
}

run_structured() {
  stage "structured-selection prefill attention, m3sa vs vLLM (issue 11)"
  M3SA_PEER_DIR="${M3SA_PEER_DIR:-.peer}" timeout 300 "$py" bench/structured_attention.py \
    --out "$out/structured_attention.json" > "$logs/structured_attention.log" 2>&1
  structured_rc=$?
  summary "structured attention rc=$structured_rc"
  grep -E "x;|Error|error" "$logs/structured_attention.log" | cut -c1-200 | tee -a "$out/summary.txt"
  [ $structured_rc -ne 0 ] && [ $rc -eq 0 ] && rc=$structured_rc
}

stage "environment"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  command -v nvcc && nvcc --version | tail -2
  "$py" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
  "$py" -m pip list 2>/dev/null | grep -i -E "^(torch|triton|nanobind|scikit.build.core|cupy.*|numpy|pytest|pytest-timeout|cmake|ninja) "
} > "$logs/environment.txt" 2>&1
cat "$logs/environment.txt"

# The pinned build requirements (pyproject.toml) when they were carried; else the device's own.
if compgen -G ".pydeps/*.whl" > /dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/m3sa_pydeps .pydeps/*.whl \
    && export PYTHONPATH="/tmp/m3sa_pydeps${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" -c "import nanobind, scikit_build_core; print('build with nanobind', nanobind.__version__, 'scikit-build-core', scikit_build_core.__version__)" | tee -a "$out/summary.txt"

stage "build and install (CUDA, sm_90a, -j$jobs)"
# build.targets=_core: the library and the extension only (not the tests' m3sa_testing).
# The image's default g++ (/opt/gcc, GCC 13.3) linked libstdc++ statically into the extension, and
# torch's shared libstdc++ in the same process then crashed on the first C++ exception (2026-12-01,
# bench/NOTES.md): the system compilers, whose libstdc++ is the one torch loads, where present.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
summary "host compiler: ${CXX:-$(command -v g++)}"
M3SA_ENABLE_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL="$jobs" timeout 420 "$py" -m pip install . -v \
  --no-build-isolation --no-deps --no-index --no-cache-dir \
  --config-settings=build-dir="build/python-cuda/{wheel_tag}" \
  --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
  --config-settings=build.targets=_core > "$logs/build.log" 2>&1
build_rc=$?
summary "build rc=$build_rc ($(grep -c -E '\.cu\.o$|Building CUDA' "$logs/build.log") CUDA objects)"
summary "extension links: $(cd /tmp && "$py" -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('m3sa').origin); print(os.path.join(d, [f for f in os.listdir(d) if f.startswith('_core')][0]))" 2>/dev/null | xargs -r ldd | grep -E 'stdc|gomp|cudart' | awk '{print $1}' | tr '\n' ' ')"
if [ $build_rc -ne 0 ]; then
  tail -40 "$logs/build.log"
  rc=$build_rc
  finish
fi
# Imported from outside the source tree: the installed package, with its CUDA backend and a device.
(cd /tmp && "$py" -c "import m3sa, torch; print('m3sa', m3sa.__version__, m3sa.build_commit(), m3sa.__file__); print('cuda backend built:', m3sa.cuda_backend_built(), 'devices:', m3sa.cuda_device_count()); print('cuda implementations:', ', '.join(i.name for i in m3sa.implementations() if i.backend == 'cuda')); assert m3sa.cuda_backend_built() and m3sa.cuda_device_count() > 0") 2>&1 | tee -a "$out/summary.txt"
import_rc=$?
if [ $import_rc -ne 0 ]; then rc=$import_rc; finish; fi

stages=",${M3SA_PYTHON_STAGES:-tests,overhead,import,structured},"
wanted() { [[ "$stages" == *",$1,"* ]]; }

if wanted tests; then
stage "pytest tests/python"
export M3SA_PEER_DIR="${M3SA_PEER_DIR:-$PWD/.peer}"
export M3SA_GPU_REPORT="$out/gpu_report.jsonl"
: > "$M3SA_GPU_REPORT"
timeout_plugin=""
"$py" -c "import pytest_timeout" 2> /dev/null && timeout_plugin="--timeout=240"
# shellcheck disable=SC2086 # timeout_plugin is one option or none
timeout 480 "$py" -m pytest tests/python -v -rA -p no:cacheprovider --durations=15 $timeout_plugin \
  --junitxml="$out/pytest.xml" > "$logs/pytest.log" 2>&1
pytest_rc=$?
summary "pytest rc=$pytest_rc: $(tail -1 "$logs/pytest.log")"
grep -E "^(FAILED|ERROR|SKIPPED)" "$logs/pytest.log" | cut -c1-300 | tee -a "$out/summary.txt"
[ $pytest_rc -ne 0 ] && rc=$pytest_rc
fi

if wanted overhead; then
stage "per-call overhead"
timeout 240 "$py" bench/python_overhead.py --out "$out/python_overhead.json" > "$logs/overhead.log" 2>&1
overhead_rc=$?
summary "overhead rc=$overhead_rc"
tail -4 "$logs/overhead.log" | tee -a "$out/summary.txt"
[ $overhead_rc -ne 0 ] && [ $rc -eq 0 ] && rc=$overhead_rc
fi

if wanted import; then
stage "import time"
repo="$PWD"
(cd /tmp && timeout 120 "$py" "$repo/bench/python_import_time.py" --out "$out/python_import_time.json") \
  > "$logs/import_time.log" 2>&1
import_rc=$?
summary "import time rc=$import_rc"
tee -a "$out/summary.txt" < "$logs/import_time.log"
[ $import_rc -ne 0 ] && [ $rc -eq 0 ] && rc=$import_rc
fi

wanted structured && run_structured
finish
