"""The built wheel installs into a fresh virtual environment and imports from outside the source tree.

scripts/run_python_tests.sh builds the wheel and names it in M3SA_WHEEL."""
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

WHEEL = os.environ.get("M3SA_WHEEL")


@pytest.mark.skipif(not WHEEL, reason="M3SA_WHEEL is not set (scripts/run_python_tests.sh sets it)")
def test_wheel_installs_into_a_fresh_environment(tmp_path):
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # --no-deps --no-index: the import must not need numpy nor the network
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", WHEEL], check=True)
    probe = ("import m3sa, pathlib; print(m3sa.__version__); print(pathlib.Path(m3sa.__file__).parent); "
             "print(','.join(m3sa.backends())); assert m3sa.supports('cpu', 'index_topk')")
    source_root = Path(__file__).resolve().parents[2]
    result = subprocess.run([python, "-c", probe], cwd=tmp_path, check=True, capture_output=True,
                            text=True, env={"PATH": os.environ.get("PATH", "")})
    version, location, backends = result.stdout.split()
    import m3sa

    assert version == m3sa.__version__
    assert Path(location).is_relative_to(env_dir) and not Path(location).is_relative_to(source_root)
    assert {"reference", "cpu"} <= set(backends.split(","))
    assert sys.version_info >= (3, 9)
    # a typed package (PEP 561): the marker and the extension's stub (tests/python/test_typing.py)
    typed = {"m3sa/py.typed", "m3sa/_core.pyi", "m3sa/_typing.pyi"}
    assert typed <= set(zipfile.ZipFile(WHEEL).namelist())
    assert all((Path(location).parent / name).is_file() for name in typed)
