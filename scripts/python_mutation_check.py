#!/usr/bin/env python3
"""Mutation check of the Python package's engine-facing layer (scripts/mutation_check.py's twin).

Applies each small mutation below to python/m3sa/vllm.py, torch.py or __init__.py, one at a time,
runs tests/python with pytest and records which tests fail; a mutation no test catches is a
survivor. Usage, from the repository root, after `bash scripts/run_python_tests.sh` (which builds
the CPU-only wheel and installs it into build/python-venv):

    scripts/python_mutation_check.py [name-substring ...]

The wheel is not rebuilt for each mutation: these files are plain Python, so the mutant is written
over the *installed* copy (build/python-venv's site-packages/m3sa/, found by importing m3sa with
that venv's python) and the original is written back afterwards, also when pytest fails, times
out or the check is interrupted (Ctrl-C, SIGTERM). The installed copies must equal the sources
(the check stops otherwise: rerun scripts/run_python_tests.sh). Bytecode caches of the file are
removed and pytest runs with PYTHONDONTWRITEBYTECODE=1, since a mutant of the same size written in
the same second as the original could otherwise be served from the original's .pyc.

Tests left out of the per-mutation run, to keep each run at about two seconds (four with torch):
- test_install.py installs the built wheel into a fresh environment, so it never sees the mutant;
- test_typing.py runs mypy over the installed package (about 6 s): it checks types, and these
  mutations change values, never a signature (its one runtime call, an index_topk on the plain
  API, is in test_ops.py too).
test_gpu.py skips on a machine without a GPU and m3sa's CUDA backend, so the CUDA-graph capture
paths of m3sa.vllm (a plan or cu_q_lens first made inside a capture is not cached) have no row:
what the rows cover of CUDA graphs is what runs on the CPU (the cached plans, workspaces, the
caller's workspace buffer and the decode cu_q_lens that a captured graph keeps using, and vLLM's
seq_len 0 padding requests).

The torch.py rows need torch (test_torch.py skips without it; pyproject.toml's test extra has none):
without it they print NOT RUN and are not counted as survivors. M3SA_PYTHON names another
interpreter with m3sa installed (default build/python-venv/bin/python), e.g. a venv with torch
(PyPI's wheel runs on the CPU) and the wheel that scripts/run_python_tests.sh built:

    python3 -m venv /tmp/torch-venv && /tmp/torch-venv/bin/pip install numpy pytest torch
    /tmp/torch-venv/bin/pip install --no-deps build/wheel/m3sa-*.whl
    M3SA_PYTHON=/tmp/torch-venv/bin/python scripts/python_mutation_check.py

Prints one Markdown table row per mutation (docs/testing.md, "Python mutation check", comes from
it) and exits 1 if a mutation survived or could not be applied.
"""
import os
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# (name, file, exact text, replacement): the text must occur exactly once in the file.
MUTATIONS = [
    # vLLM's attention arguments: what m3sa cannot serve must raise, naming vLLM's argument.
    ("vllm: sm_scale accepted within 1 %", "python/m3sa/vllm.py",
     "math.isclose(float(sm_scale), SOFTMAX_SCALE, rel_tol=1e-6)):",
     "math.isclose(float(sm_scale), SOFTMAX_SCALE, rel_tol=1e-2)):"),
    ("vllm: one-call decode attention ignores sm_scale", "python/m3sa/vllm.py",
     "    if not math.isclose(float(sm_scale), SOFTMAX_SCALE, rel_tol=1e-6):\n        return False",
     "    if False:\n        return False"),
    ("vllm: kv_cache heads unchecked against num_kv_heads", "python/m3sa/vllm.py",
     "    if not (kv_cache.shape[1] == num_kv_heads):", "    if not (True):"),
    ("vllm: q heads not a multiple of num_kv_heads accepted", "python/m3sa/vllm.py",
     "    if not (q.shape[1] % num_kv_heads == 0):", "    if not (q.shape[1] >= num_kv_heads):"),
    ("vllm: output checked for its rank only", "python/m3sa/vllm.py",
     "    if not (tuple(output.shape) == tuple(q.shape)):",
     "    if not (len(output.shape) == len(q.shape)):"),
    ("vllm: k_scale / v_scale applied to a bf16 cache", "python/m3sa/vllm.py",
     "        return dtype, 1.0, 1.0",
     '        return dtype, _scale(k_scale, "k_scale"), _scale(v_scale, "v_scale")'),
    ("vllm: k_scale and v_scale swapped", "python/m3sa/vllm.py",
     'return dtype, _scale(k_scale, "k_scale"), _scale(v_scale, "v_scale")',
     'return dtype, _scale(v_scale, "v_scale"), _scale(k_scale, "k_scale")'),
    ("vllm: fp8 scales default to 0.5, not 1", "python/m3sa/vllm.py",
     "    if value is None:\n        return 1.0", "    if value is None:\n        return 0.5"),
    # Prefill metadata: vLLM's prefix_lens as m3sa's seq_lens, the score's width and block table.
    ("vllm: index_score does not check seq_lens", "python/m3sa/vllm.py",
     "_prefill_seq_lens(cu_seqlens_q, prefix_lens, seq_lens)\n    # vLLM's score",
     "_prefill_seq_lens(cu_seqlens_q, prefix_lens)\n    # vLLM's score"),
    ("vllm: index_score's block table not cut to max_seq_len", "python/m3sa/vllm.py",
     "table = block_table[:, :min(block_table.shape[1], max(max_block, 1))]", "table = block_table"),
    ("vllm: index_topk init_blocks and local_blocks swapped", "python/m3sa/vllm.py",
     "(_index_config(num_heads, topk, init_blocks, local_blocks), num_reqs",
     "(_index_config(num_heads, topk, local_blocks, init_blocks), num_reqs"),
    # Decode: the one-call path and the general one, their batch and cached cu_q_lens.
    ("vllm: index_decode (one call) init_blocks and local_blocks swapped", "python/m3sa/vllm.py",
     'planned = _decode_plan("index_topk", idx_q, num_kv_heads, topk, init_blocks, local_blocks,',
     'planned = _decode_plan("index_topk", idx_q, num_kv_heads, topk, local_blocks, init_blocks,'),
    ("vllm: index_decode (one call) runs past max_decode_query_len", "python/m3sa/vllm.py",
     "    if not (decode_query_len <= max_decode_query_len):\n        return None",
     "    if False:\n        return None"),
    ("vllm: one-call index_decode errors surface with m3sa's names", "python/m3sa/vllm.py",
     "    except ValueError:\n        return None", "    except TypeError:\n        return None"),
    ("vllm: general decode batch with decode_q_len 1", "python/m3sa/vllm.py",
     "num_decode_requests=num_reqs, decode_q_len=decode_query_len)",
     "num_decode_requests=num_reqs, decode_q_len=1)"),
    ("vllm: decode cu_q_lens cached without decode_query_len", "python/m3sa/vllm.py",
     "key = (device, _is_torch(like), num_reqs, decode_query_len)",
     "key = (device, _is_torch(like), num_reqs)"),
    ("vllm: ragged decode's token_to_req_indices unchecked", "python/m3sa/vllm.py",
     "if not (np.array_equal(owners[:len(want)], want)):",
     "if not (len(owners) >= len(want)):"),
    ("vllm: ragged decode's query_start_loc length unchecked", "python/m3sa/vllm.py",
     "        if not (query_start_loc.shape[0] == num_reqs + 1):", "        if False:"),
    # Plans and workspaces: the cache key, the capacities, the caller's workspace buffer.
    ("vllm: plan cache key without the cache dtype", "python/m3sa/vllm.py",
     "    key = (op, backend, device, config, caps, dtype)",
     "    key = (op, backend, device, config, caps)"),
    ("vllm: capacities of an exact power of two doubled", "python/m3sa/vllm.py",
     "return 1 << max(0, int(n) - 1).bit_length()", "return 1 << int(n).bit_length()"),
    ("vllm: host arrays default to the reference backend", "python/m3sa/vllm.py",
     'host_backend = "cpu"', 'host_backend = "reference"'),
    ("vllm: workspace buffer slices not 64-byte aligned", "python/m3sa/vllm.py",
     "start = offset + (-(base + offset) % WORKSPACE_ALIGNMENT)", "start = offset"),
    ("vllm: workspace buffer slices overlap", "python/m3sa/vllm.py",
     "        _arena[1] = end\n", ""),
    ("vllm: clear_caches does not rewind the workspace buffer", "python/m3sa/vllm.py",
     "    if _arena:\n        _arena[1] = 0", "    if _arena:\n        pass"),
    ("vllm: an array on another DLPack device accepted", "python/m3sa/vllm.py",
     "    if int(kind) not in (_DLPACK_CPU, _DLPACK_CUDA):", "    if False:"),
    # m3sa's own ops in m3sa's layout: defaults and scales as the plain API's.
    ("vllm: norm_rope_insert k_scale and v_scale swapped", "python/m3sa/vllm.py",
     "k_scale=float(k_scale), v_scale=float(v_scale))",
     "k_scale=float(v_scale), v_scale=float(k_scale))"),
    ("vllm: norm_rope_insert default eps 1e-5", "python/m3sa/vllm.py",
     "    rms_norm_eps: float = 1e-6,", "    rms_norm_eps: float = 1e-5,"),
    ("vllm: sparse_attention drops its decode requests", "python/m3sa/vllm.py",
     "num_decode_requests=int(num_decode_requests), decode_q_len",
     "num_decode_requests=0, decode_q_len"),
    ("vllm: sparse_attention scales V by k_scale", "python/m3sa/vllm.py",
     "         v_scale=float(v_scale))", "         v_scale=float(k_scale))"),
    # The bf16 helpers every numpy caller uses to make bf16 inputs and read bf16 outputs.
    ("m3sa: to_bf16_bits rounds ties away from zero", "python/m3sa/__init__.py",
     "rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16", "rounded = (bits + 0x8000) >> 16"),
    ("m3sa: to_bf16_bits rounds a NaN like a number", "python/m3sa/__init__.py",
     "np.where(nan, (bits >> 16) | 0x40, rounded)", "np.where(nan, rounded, rounded)"),
    ("m3sa: to_bf16_bits turns infinity into NaN", "python/m3sa/__init__.py",
     "nan = (bits & 0x7FFFFFFF) > 0x7F800000", "nan = (bits & 0x7FFFFFFF) >= 0x7F800000"),
    # torch.ops.m3sa: the fake kernels torch.compile traces with, the schemas, the dispatch.
    ("torch: index_score's fake width not rounded to 16", "python/m3sa/torch.py",
     "    return -(-max_block // 16) * 16", "    return max_block"),
    ("torch: index_topk's fake output token-major", "python/m3sa/torch.py",
     "(score.shape[0], score.shape[1], topk)", "(score.shape[1], score.shape[0], topk)"),
    ("torch: sparse_attn's output not declared mutated", "python/m3sa/torch.py",
     '@_op(mutates_args=("output",))\ndef sparse_attn(q', "@_op()\ndef sparse_attn(q"),
    ("torch: norm_rope_insert's index_kv_cache not declared mutated", "python/m3sa/torch.py",
     '"idx_q_out", "index_kv_cache"))', '"idx_q_out"))'),
    ("torch: ops registered for CUDA tensors only", "python/m3sa/torch.py",
     'for dispatch_key in ("CPU", "CUDA"):', 'for dispatch_key in ("CUDA",):'),
    ("torch: sparse_attention scales V by k_scale", "python/m3sa/torch.py",
     "decode_query_len, None, k_scale, v_scale)", "decode_query_len, None, k_scale, k_scale)"),
    ("torch: sparse_attn_decode drops query_start_loc", "python/m3sa/torch.py",
     "                                        query_start_loc, token_to_req_indices)",
     "                                        None, token_to_req_indices)"),
]

PYTHON = os.environ.get("M3SA_PYTHON", "build/python-venv/bin/python")
if os.sep in PYTHON:  # a path (not a name on PATH): absolute, as m3sa is imported from elsewhere
    PYTHON = os.path.abspath(PYTHON)  # abspath, not resolve: a venv's python is a symlink
# test_install.py and test_typing.py: see the docstring.
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/python",
          "--ignore=tests/python/test_install.py", "--ignore=tests/python/test_typing.py"]
TIMEOUT_S = 300  # a mutant that hangs the suite counts as caught


def installed_package():
    """The installed m3sa's folder, imported from outside the tree (not python/m3sa)."""
    found = subprocess.run([PYTHON, "-c", "import m3sa, os; print(os.path.dirname(m3sa.__file__))"],
                           capture_output=True, text=True, cwd=tempfile.gettempdir())
    if found.returncode != 0:
        sys.exit(f"{PYTHON} cannot import m3sa: run `bash scripts/run_python_tests.sh` first\n"
                 + found.stderr)
    return Path(found.stdout.strip())


def has_torch():
    return subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


def drop_bytecode(installed):
    for cached in (installed.parent / "__pycache__").glob(installed.stem + ".*.pyc"):
        cached.unlink()


def failing_tests():
    """The ids of the tests that fail or error (from pytest's junit report), or why there are none."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.xml"
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        try:
            run = subprocess.run([PYTHON, *PYTEST, f"--junitxml={report}"], capture_output=True,
                                 text=True, errors="replace", env=env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return [f"(timed out after {TIMEOUT_S} s)"]
        names = []
        if report.exists():
            for case in ElementTree.parse(report).iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    module = case.get("classname", "").rsplit(".", 1)[-1]
                    names.append(f"{module}::{case.get('name')}" if module else case.get("name"))
    return names if names or run.returncode == 0 else [f"(pytest exit {run.returncode})"]


def apply_and_test(installed, original, mutated):
    """Runs the suite over the mutant written to the installed file; restores it in any case."""
    status = installed.stat()
    try:
        installed.write_text(mutated)
        drop_bytecode(installed)
        return failing_tests()
    finally:
        installed.write_text(original)
        os.utime(installed, ns=(status.st_atime_ns, status.st_mtime_ns))
        drop_bytecode(installed)


def shorten(failed):
    return ", ".join(failed[:6]) + (f" (+{len(failed) - 6} more)" if len(failed) > 6 else "")


def interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    # SIGTERM as Ctrl-C, so that apply_and_test's finally restores the installed file.
    signal.signal(signal.SIGTERM, interrupt)
    wanted = sys.argv[1:]
    package = installed_package()
    rows = [row for row in MUTATIONS if not wanted or any(w in row[0] for w in wanted)]
    files = sorted({row[1] for row in rows})
    for path in files:
        installed = package / Path(path).name
        if not installed.is_file() or installed.read_text() != Path(path).read_text():
            sys.exit(f"{installed} differs from {path}: rerun `bash scripts/run_python_tests.sh` "
                     "(or reinstall its wheel into M3SA_PYTHON's environment)")
    baseline = failing_tests()
    if baseline:
        sys.exit(f"the unmutated suite fails: {shorten(baseline)}")
    torch_installed = has_torch()
    survivors = not_run = 0
    print("| mutation | file | failing tests |\n|---|---|---|", flush=True)
    for name, path, text, replacement in rows:
        source = Path(path).read_text()
        if source.count(text) != 1:
            print(f"| {name} | {path} | NOT APPLIED: text found {source.count(text)} times |")
            survivors += 1
            continue
        if path.endswith("torch.py") and not torch_installed:
            print(f"| {name} | {path} | NOT RUN: torch is not installed |", flush=True)
            not_run += 1
            continue
        failed = apply_and_test(package / Path(path).name, source, source.replace(text, replacement))
        survivors += not failed
        print(f"| {name} | {path} | {shorten(failed) or 'SURVIVED'} |", flush=True)
    if not_run:
        print(f"{not_run} torch.py rows not run: run the check where torch is installed",
              file=sys.stderr)
    for path in files:  # apply_and_test restored each; say so if anything else changed them
        if (package / Path(path).name).read_text() != Path(path).read_text():
            sys.exit(f"{package / Path(path).name} no longer equals {path}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
