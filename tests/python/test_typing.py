"""m3sa is a typed package (PEP 561): mypy checks the installed package and a consumer's use of it.

The stubs of m3sa._core are generated at build time by nanobind's stubgen (python/CMakeLists.txt);
m3sa/py.typed marks the package. mypy runs on the installed package (scripts/run_python_tests.sh
installs the wheel), never on python/ in the source tree: from a temporary directory, without
MYPYPATH. torch is optional: its imports (m3sa.torch; m3sa.vllm imports it lazily) are Any here.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import m3sa

pytest.importorskip("mypy", reason="mypy is in pyproject.toml's test extra")

MYPY_INI = """\
[mypy]

[mypy-torch.*]
ignore_missing_imports = True
follow_imports = skip
"""

# README.md's Python example and the rest of the plain API, as a consumer writes it: it must
# type-check under --strict with the types asserted (Any would fail assert_type), and run.
GOOD = """\
from typing import TYPE_CHECKING, Any, assert_type

import numpy as np
import numpy.typing as npt

import m3sa
import m3sa.vllm

config = m3sa.Config(top_k=16, num_index_heads=4)
plan = m3sa.make_plan("index_topk", "cpu", config,  # once; reused for every batch within capacities
                      m3sa.Capacities(max_requests=1, max_tokens=1, max_blocks_per_request=8))
workspace = m3sa.allocate_workspace(plan)  # or any 64-byte aligned buffer of plan.workspace_bytes
index_q = m3sa.to_bf16_bits(np.random.randn(1, 4, 128))          # [T, H, 128] bf16 as uint16 bits
index_k_cache = m3sa.to_bf16_bits(np.random.randn(8, 128, 128))  # [pages, 128, 128]
batch = m3sa.Batch(np.array([0, 1], np.int32), np.array([1000], np.int32),  # one decode request
                   np.arange(8, dtype=np.int32)[None], num_tokens=1, num_decode_requests=1)
topk = np.empty((4, 1, 16), np.int32)                            # [H, T, K] block ids, -1 padded
m3sa.index_topk(plan, index_q, index_k_cache, batch, topk, workspace=workspace)
print(plan.implementation, topk[0, 0])

attention = m3sa.make_plan("sparse_attention", "cpu", config,
                           m3sa.Capacities(max_requests=1, max_tokens=1, max_blocks_per_request=8),
                           "bf16", num_threads=1)
k_cache = m3sa.to_bf16_bits(np.random.randn(8, 128, 4, 128))  # [pages, 128, Hkv, 128]
v_cache = m3sa.to_bf16_bits(np.random.randn(8, 128, 4, 128))
q = m3sa.to_bf16_bits(np.random.randn(1, 4, 128))
out = np.zeros((1, 4, 128), np.uint16)
lse = np.zeros((1, 4), np.float32)
m3sa.sparse_attention(attention, q, k_cache, v_cache, topk, batch, out, lse=lse,
                      workspace=m3sa.allocate_workspace(attention))
m3sa.vllm.clear_caches()

assert_type(config, m3sa.Config)
assert_type(config.top_k, int)
assert_type(plan, m3sa.Plan)
assert_type(plan.workspace_bytes, int)
assert_type(plan.implementation, str)
assert_type(batch.num_tokens, int)
assert_type(workspace, npt.NDArray[np.uint8])
assert_type(m3sa.from_bf16_bits(out), npt.NDArray[np.float32])
assert_type(m3sa.supports("cpu", "index_topk", config), m3sa.Support)
assert_type(m3sa.supports("cpu").reason, str)
assert_type(m3sa.implementations(), list[m3sa.Implementation])
assert_type(m3sa.implementations()[0].name, str)
assert_type(m3sa.backends(), list[str])
assert_type(m3sa.__version__, str)
assert_type(m3sa.cuda_backend_built(), bool)
assert_type(m3sa.vllm.plan_cache(), list[tuple[Any, ...]])
assert_type(m3sa.vllm.device_errors(), dict[tuple[Any, ...], int])
assert m3sa.supports("cpu", "sparse_attention") and m3sa.Implementation(*"abcd").op == "c"
assert np.any(out != 0) and topk[0, 0, 0] == 0

if TYPE_CHECKING:
    from typing_extensions import CapsuleType

    class Producer:  # a DLPack producer that is not numpy, as torch.Tensor is
        def __dlpack__(self, *, stream: object = None) -> CapsuleType:
            raise NotImplementedError

    def other_arrays(producer: Producer, capsule: CapsuleType, buffer: memoryview) -> None:
        m3sa.index_topk(plan, producer, capsule, batch, buffer, num_threads=2, stream=0)
"""

# Calls a consumer gets wrong: mypy must flag each line marked "# error" (and no other line).
BAD = """\
import numpy as np

import m3sa
import m3sa.vllm

config = m3sa.Config(top_k="16")  # error: a str where an int is expected
m3sa.Config(num_index_head=4)  # error: misspelled keyword
capacities = m3sa.Capacities(max_requests=1, max_tokens=1, max_blocks_per_request=8)
plan = m3sa.make_plan("index_topk", "cpu", m3sa.Config(), capacities)
m3sa.make_plan("index_topk", "cpu", m3sa.Config())  # error: capacities missing
m3sa.make_plan("index_topk", "cpu", capacities, m3sa.Config())  # error: arguments swapped
cu_q_lens, seq_lens = np.zeros(2, np.int32), np.ones(1, np.int32)
block_table = np.zeros((1, 8), np.int32)
batch = m3sa.Batch(cu_q_lens, seq_lens, block_table, num_tokens=1)
m3sa.Batch(cu_q_lens, seq_lens, block_table)  # error: num_tokens missing
arrays = np.zeros((1, 4, 128), np.uint16)
m3sa.index_topk(plan, arrays, arrays, batch, arrays, worksapce=None)  # error: misspelled keyword
m3sa.index_topk(plan, [1, 2], arrays, batch, arrays)  # error: a list is no array
m3sa.index_topk(plan, arrays, arrays, batch, arrays, num_threads=2.5)  # error: a float thread count
m3sa.index_topk(plan, arrays, arrays, batch)  # error: topk missing
size: str = plan.workspace_bytes  # error: an int
m3sa.implementations()[0].nmae  # error: misspelled attribute
m3sa.supports("cpu", op=3)  # error: an int op name
m3sa.vllm.set_workspace_buffer()  # error: buffer missing
"""


def run_mypy(cwd, *args):
    env = {key: value for key, value in os.environ.items() if key != "MYPYPATH"}
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini",
                             "--cache-dir", str(cwd / ".mypy_cache"), *args], cwd=cwd, env=env,
                            capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def error_lines(output, name):
    return sorted({int(line) for line in re.findall(rf"^{name}:(\d+): error:", output, re.M)})


def marked_lines(source):
    return [number for number, line in enumerate(source.splitlines(), 1) if "# error" in line]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory outside the source tree with the mypy configuration and the consumer scripts."""
    source_root = Path(__file__).resolve().parents[2]
    package = Path(m3sa.__file__).resolve().parent
    assert not package.is_relative_to(source_root / "python"), "m3sa must be the installed package"
    path = tmp_path_factory.mktemp("typing")
    (path / "mypy.ini").write_text(MYPY_INI)
    (path / "consumer_good.py").write_text(GOOD)
    (path / "consumer_bad.py").write_text(BAD)
    return path


def test_installed_package_type_checks(workdir):
    rc, output = run_mypy(workdir, "-p", "m3sa")
    assert rc == 0, output
    assert re.search(r"^Success: no issues found in \d+ source files$", output, re.M), output


def test_consumer_type_checks_strictly_and_runs(workdir):
    rc, output = run_mypy(workdir, "--strict", "consumer_good.py")
    assert rc == 0, output
    result = subprocess.run([sys.executable, "consumer_good.py"], cwd=workdir, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("cpu.index_topk [ 0  1  2  3  4  5  6  7 -1")


def test_wrong_calls_are_flagged(workdir):
    """Each wrong call is an error: the public API's types are real, not Any."""
    rc, output = run_mypy(workdir, "consumer_bad.py")
    assert rc == 1, output
    assert error_lines(output, "consumer_bad.py") == marked_lines(BAD), output
