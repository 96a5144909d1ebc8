"""The sandbox holds, as root and as an unprivileged user (issue #57): each class of attack is an
actual attempt (tests/envs/sandbox_attacks.py) that must be refused; the limits hold for the whole
call (all its processes together), with and without the sandbox."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpokit.envs.python_tool import PythonLimits, run_python, sandbox_available

sys.path.insert(0, str(Path(__file__).parent))
import sandbox_attacks  # noqa: E402

ENVS = Path(__file__).parents[2] / "src" / "grpokit" / "envs"
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (make setup installs it as root)"
)


def check_refused(r: dict[str, str], *, as_root: bool) -> None:
    assert r["proc_root_write"] == "written []" and r["target_after"] == "original"
    assert r["remount"].endswith("written []") and not r["remount"].startswith("mount 0")
    assert r["secrets"].startswith("none")  # no environ, cmdline or /etc/shadow of the host's processes
    net = r["network"]
    assert "connected" not in net and "ConnectionRefusedError" in net and r["accepted"] == ""
    assert "FileNotFoundError" in net  # the host's unix socket is not in the sandbox
    privileges = ast.literal_eval(r["privileges"])
    assert privileges[:3] == ["0000000000000000"] * 3  # no capability: effective, permitted, bounding
    assert privileges[3:5] == ["PermissionError", "ValueError"]  # chroot, raise a limit
    # ptrace: no host process is visible to name; the sandbox's own init (bwrap's, root's as root)
    # is refused as root, and is the same sandbox for an ordinary user
    assert privileges[5] == -1 or not as_root
    assert privileges[6] in ("PermissionError", "OSError")  # /usr stays unwritable
    # a nested user + mount namespace (refused for an ordinary user; as root the per-call user may
    # make one) cannot make the read-only mounts it inherits writable, nor write to them
    assert privileges[8] == -1 and (privileges[7] == -1 or as_root)
    assert r["setsid_daemon"] == "parent done"
    time.sleep(0.3)
    assert not daemons(), "a setsid process outlived the call"


def daemons() -> list[str]:
    out = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and b"31.4159" in Path(f"/proc/{d}/cmdline").read_bytes():
                out.append(d)
        except OSError:
            pass
    return out


@needs_bwrap
def test_every_attack_is_refused_as_this_user():
    assert sandbox_available()
    check_refused(sandbox_attacks.run_all(), as_root=os.geteuid() == 0)


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to become another user")
def test_every_attack_is_refused_as_an_unprivileged_user():
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="grpokit-unpriv-", dir="/tmp"))  # pytest's tmp_path is root's only
    try:
        _as_nobody(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _as_nobody(root: Path) -> None:
    pkg = root / "pkg"
    (pkg / "grpokit" / "envs").mkdir(parents=True)
    (pkg / "grpokit" / "__init__.py").write_text("")
    (pkg / "grpokit" / "envs" / "__init__.py").write_text("")
    for name in ("python_tool.py", "sandbox.py", "proc_usage.py"):
        shutil.copy(ENVS / name, pkg / "grpokit" / "envs" / name)
    shutil.copy(Path(sandbox_attacks.__file__), pkg / "attacks.py")
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            python,
            "-I",
            str(pkg / "attacks.py"),
            str(pkg),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )
    if "Permission denied" in done.stderr and done.returncode != 0 and not done.stdout:
        pytest.fail(f"the unprivileged user cannot reach the test's files: {done.stderr[-500:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    check_refused(json.loads(done.stdout.strip().splitlines()[-1]), as_root=False)


MODES = ["auto", "none"]


@pytest.mark.parametrize("sandbox", MODES)
def test_cpu_limit_holds_for_the_whole_call(sandbox):
    # two processes, each 0.8 s of CPU (under the per-process limit), 1.6 s together
    code = (
        "import os, time\n"
        "def spin():\n    t = time.process_time()\n    while time.process_time() - t < 0.8: pass\n"
        "pids = [os.fork() for _ in range(1)]\n"
        "spin()\n"
        "if pids[0]: os.wait()\n"
        "print('finished')"
    )
    out, counts = run_python(code, PythonLimits(cpu_s=1, wall_s=8, sandbox=sandbox))
    assert out == "error: CPU time limit (1 s)" and counts["tool_timeouts"] == 1


@pytest.mark.parametrize("sandbox", MODES)
def test_memory_limit_holds_for_the_whole_call(sandbox):
    # three processes holding 150 MiB each (under the 300 MiB per process), 450 MiB together
    code = "import os, time\nos.fork(); os.fork()\nx = b'x' * (150 * 2**20)\ntime.sleep(3)\nprint('held')"
    out, _ = run_python(code, PythonLimits(memory_mb=300, wall_s=8, sandbox=sandbox))
    assert "held" not in out and out.endswith("error: memory limit (300 MiB)")


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", MODES)
def test_disk_limit_holds_for_the_whole_call(sandbox):
    # 40 files of 1 MiB (each under file_mb) against 8 MiB for the call
    code = (
        "import time\nn = 0\n"
        "try:\n"
        "    for i in range(40):\n"
        "        open(f'f{i}', 'wb').write(b'0' * 2**20); n += 1; time.sleep(0.02)\n"
        "except OSError as e:\n    print('refused', type(e).__name__)\n"
        "print('written', n)\ntime.sleep(1)"
    )
    out, _ = run_python(code, PythonLimits(file_mb=2, disk_mb=8, wall_s=8, sandbox=sandbox))
    assert "written 40" not in out
    assert ("refused OSError" in out and "written 8" in out) or out.endswith("error: disk limit (8 MiB)")


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", MODES)
def test_process_limit_holds_for_the_whole_call(sandbox):
    code = (
        "import os, time\nn = 0\n"
        "try:\n"
        "    for _ in range(60):\n"
        "        if os.fork() == 0:\n            time.sleep(5); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n    print('refused', type(e).__name__)\n"
        "print('forked', n); time.sleep(1)"
    )
    out, _ = run_python(code, PythonLimits(processes=8, wall_s=8, sandbox=sandbox))
    assert "forked 60" not in out
    assert "refused BlockingIOError" in out or out.endswith("error: process limit (8)")


@pytest.mark.parametrize("sandbox", MODES)
def test_the_folder_is_removed_whatever_the_code_did(sandbox, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = "import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\n"
    code += "os.chmod('a/b', 0)\nos.chmod('a', 0)\nprint('locked')"
    out, _ = run_python(code, PythonLimits(sandbox=sandbox))
    assert out == "locked" and list(tmp_path.iterdir()) == []
