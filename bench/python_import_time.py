"""Import time of the installed m3sa package (issue 14's target: measured, reported in bench/NOTES.md).

Runs each import in a fresh interpreter `--repeats` times and reports medians in milliseconds:
an empty interpreter, `import m3sa`, `import m3sa.vllm`, and `import m3sa.torch` where torch is
installed (that one includes torch's own import, reported beside `import torch` alone). The
import cost of a module is its median minus the empty interpreter's. Run it with the Python that
has the wheel installed, from outside the source tree (so that the installed package is the one
imported), e.g.

    cd /tmp && /path/to/venv/bin/python /path/to/bench/python_import_time.py --out import.json
"""
import argparse
import json
import statistics
import subprocess
import sys
import time


def median_ms(statement, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--out", help="also write the results as JSON to this file")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-c", "import m3sa"], check=True)  # warm the file cache
    statements = {"empty interpreter": "pass", "import m3sa": "import m3sa",
                  "import m3sa.vllm": "import m3sa.vllm"}
    has_torch = subprocess.run([sys.executable, "-c", "import torch"],
                               capture_output=True).returncode == 0
    if has_torch:
        statements.update({"import torch": "import torch", "import m3sa.torch": "import m3sa.torch"})
    results = {name: median_ms(code, args.repeats) for name, code in statements.items()}
    base = results["empty interpreter"]
    version = subprocess.run([sys.executable, "-c", "import m3sa; print(m3sa.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    report = {"what": "median wall ms of a fresh interpreter running the statement; cost = minus the "
                      "empty interpreter", "python": sys.version.split()[0], "m3sa": version,
              "repeats": args.repeats,
              "results": {name: {"wall_ms": round(ms, 2), "cost_ms": round(ms - base, 2)}
                          for name, ms in results.items()}}
    for name, row in report["results"].items():
        print(f"{name:20s} {row['wall_ms']:8.2f} ms wall, {row['cost_ms']:8.2f} ms over the empty interpreter")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
