"""This machine's dense matmul peak with torch (fp32 and bf16), for model-FLOPs utilization.

Square ``n × n`` matmuls (2·n³ FLOPs each) at a few sizes, best of several repeats; the peak is
the best size. Honors the thread count torch starts with (``OMP_NUM_THREADS``).

    python bench/peak_flops.py [--out peak.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def matmul_gflops(dtype: torch.dtype, n: int, repeats: int = 7, inner: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            a @ b
        best = min(best, (time.perf_counter() - t0) / inner)
    return 2 * n**3 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--sizes", default="512,1024,2048")
    a = ap.parse_args()
    out = {"threads": torch.get_num_threads()}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        by_size = {n: matmul_gflops(dt, n) for n in map(int, a.sizes.split(","))}
        out[name] = {"peak_gflops": max(by_size.values()), "by_size": by_size}
    text = json.dumps(out, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
