"""The layering of docs/design.md ("Layers"), enforced with import-linter (contracts in
pyproject.toml): no module imports from a layer above its own, the algorithm core and the experience
batch import only torch, only ``grpokit.backends`` reaches into the CPU speed backend, and no sibling
modules or packages import each other in a cycle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.fail(f"{lint} missing: install the test extra (pip install -e '.[test]')")
    res = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "0 broken" in out and "4 kept" in out, out[-2000:]
