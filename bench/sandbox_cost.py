"""The ``python`` tool's cost per call (issue #57): the median wall time of ``--calls`` calls of a
trivial ``print``, with the bubblewrap sandbox and without it, measured in the same run.

    .venv/bin/python bench/sandbox_cost.py [--calls 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from grpokit.envs.python_tool import PythonLimits, run_python, sandbox_available


def median_ms(sandbox: str, calls: int) -> float:
    limits = PythonLimits(sandbox=sandbox)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        out, _ = run_python("print(1)", limits)
        times.append(time.perf_counter() - t0)
        assert out == "1", out
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not sandbox_available():
        raise SystemExit("bubblewrap does not run here (make sandbox); nothing to compare")
    run_python("print(1)", PythonLimits(sandbox="required"))  # warm the probe and the page cache
    plain, boxed = median_ms("none", a.calls), median_ms("required", a.calls)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, euid {os.geteuid()}",
        "calls": a.calls,
        "median_ms_limits_only": round(plain, 1),
        "median_ms_sandbox": round(boxed, 1),
        "ratio": round(boxed / plain, 2),
    }
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
