"""The layering of docs/design.md ("Layers"), enforced with import-linter (contracts in
pyproject.toml): no module imports from a layer above its own, only ``grpokit.backends`` imports the
CPU speed backend, and no sibling modules or packages import each other in a cycle; and, as an
allow-list here, the algorithm core and the experience batch import only torch and the standard
library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.fail(f"{lint} missing: install the test extra (pip install -e '.[test]')")
    res = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "0 broken" in out and "3 kept" in out, out[-2000:]


def third_party_imports(graph: grimp.ImportGraph, package: str) -> dict[str, set[str]]:
    """Module -> the top-level names of what it imports outside grpokit and the standard library."""
    modules = {package} | (graph.find_descendants(package) if graph.find_children(package) else set())
    out = {}
    for m in sorted(modules):
        ext = {i.split(".")[0] for i in graph.find_modules_directly_imported_by(m)}
        ext = {e for e in ext if e != "grpokit" and e not in sys.stdlib_module_names}
        if ext:
            out[m] = ext
    return out


@pytest.mark.parametrize("package", ["grpokit.algo", "grpokit.experience"])
def test_core_imports_only_torch(package):
    graph = grimp.build_graph("grpokit", include_external_packages=True)
    found = third_party_imports(graph, package)
    assert all(ext <= {"torch"} for ext in found.values()), found
    assert found  # torch itself is seen: the check looks at the real imports
