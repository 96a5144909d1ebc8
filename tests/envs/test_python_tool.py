"""The ``python`` tool: each limit stops the code and says so, nothing is left running, and what the
sandbox stops where the machine gives namespaces (else ``sandbox="required"`` refuses to run)."""

from __future__ import annotations

import time

import pytest

from grpokit.envs.python_tool import PythonLimits, run_python, sandbox_available
from grpokit.envs.tools import ToolEnv

FAST = dict(cpu_s=1, wall_s=3)
MODES = ["auto", "none"]


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for a parent that never reaps counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def run(code: str, **limits):
    return run_python(code, PythonLimits(**{**FAST, **limits}))


@pytest.mark.parametrize("sandbox", MODES)
def test_output_errors_and_a_clean_start(sandbox):
    assert run("print(6 * 7)", sandbox=sandbox) == ("42", {"tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0})
    out, counts = run("def f():\n    return 1 / 0\nf()", sandbox=sandbox)
    assert out.startswith('Traceback (most recent call last):\n  File "main.py", line 3')  # no launcher frames
    assert out.endswith("ZeroDivisionError: division by zero\nerror: exit status 1") and counts["tool_errors"] == 1
    out, _ = run(
        "import os, sys; print(sorted(os.listdir('.')), sorted(os.environ), repr(sys.stdin.read()))", sandbox=sandbox
    )
    listing, env, stdin = out.split("] ")[0] + "]", out.split("] ")[1] + "]", out.rsplit(" ", 1)[1]
    assert listing == "['main.py']" and stdin == "''"  # a fresh folder, no stdin
    assert set(eval(env)) <= {
        "HOME",
        "LANG",
        "PATH",
        "PWD",
        "OLDPWD",
        "PYTHONIOENCODING",
        "TMPDIR",
    }  # cleared environment


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", MODES)
def test_each_limit_stops_the_code(sandbox):
    t0 = time.perf_counter()
    out, counts = run("while True: pass", sandbox=sandbox)
    assert out == "error: CPU time limit (1 s)" and counts == {"tool_calls": 1, "tool_errors": 1, "tool_timeouts": 1}
    out, counts = run("import time; time.sleep(60)", sandbox=sandbox, wall_s=1)
    assert out == "error: timed out after 1 s" and counts["tool_timeouts"] == 1
    assert time.perf_counter() - t0 < 10
    out, _ = run("x = bytearray(100 * 2**30)", sandbox=sandbox)  # 100 GB
    assert "MemoryError" in out and out.endswith("error: exit status 1")
    out, _ = run("open('big', 'wb').write(b'0' * (3 * 2**20))", sandbox=sandbox, file_mb=1)
    assert "File too large" in out
    out, counts = run("print('y' * 10**6)", sandbox=sandbox, max_output_bytes=100)
    assert out == "y" * 100 + "\nerror: output cut at 100 bytes" and counts["tool_errors"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", MODES)
def test_a_forked_process_does_not_outlive_the_call(sandbox):
    code = "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\nelse:\n    print(pid, os.getpid())"
    out, _ = run(code, sandbox=sandbox, wall_s=2)
    if sandbox == "auto" and sandbox_available():
        # a PID namespace whose init is bwrap's: the code is its second process, and its end ends
        # the namespace, the child with it (no wall-clock wait)
        assert out.split()[1] == "2" and "timed out" not in out
    else:  # the child holds the output open until the wall clock, then the process group is killed
        child = int(out.split()[0])
        assert out.endswith("error: timed out after 2 s")
        time.sleep(0.2)
        assert not running(child)


def test_what_the_sandbox_stops(tmp_path):
    outside = tmp_path / "outside.txt"
    escape = f"open({str(outside)!r}, 'w').write('x')"
    net = "import socket; socket.create_connection(('10.255.255.1', 80), timeout=1)"
    if not sandbox_available():
        with pytest.raises(RuntimeError, match="sandbox=required: "):
            run("print(1)", sandbox="required")
        run(escape, sandbox="none")
        assert outside.exists()  # documented: without the sandbox the code writes where the user can
        return
    out, _ = run(escape, sandbox="required")
    assert "No such file or directory" in out and not outside.exists()  # the host's folders are not there
    out, _ = run("open('/usr/x', 'w')", sandbox="required")
    assert "Read-only file system" in out or "Permission denied" in out
    out, _ = run(net, sandbox="required")
    assert "Network is unreachable" in out
    assert run("open('here.txt', 'w').write('ok'); print(open('here.txt').read())", sandbox="required")[0] == "ok"


def test_required_refuses_when_the_environment_is_built(monkeypatch):
    from grpokit.envs import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.isolation_problem.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="sandbox=required: bwrap .bubblewrap. is not installed"):
            ToolEnv(tools=["python"], python={"sandbox": "required"})
        with pytest.warns(RuntimeWarning, match="WITHOUT A SANDBOX"):
            ToolEnv(tools=["python"], python={"sandbox": "auto"})
    finally:
        sandbox.isolation_problem.cache_clear()


def test_error_texts_are_cut_and_the_equals_scan_is_linear():
    env = ToolEnv(tools=["calculator"], call_format="json", max_output_chars=50)
    obs = env.start({}).step('<tool_call>{"name": "' + "x" * 5000 + '"}</tool_call>', ended_by_eos=False)
    assert len(obs.text) < 100 and obs.text.endswith("[cut at 50 characters]")
    env = ToolEnv(tools=["calculator"], call_format="equals")
    t0 = time.perf_counter()
    obs = env.start({}).step("1" * 200_000 + "x" + "2 + 3 =", ended_by_eos=False)
    assert obs.text == " 5" and time.perf_counter() - t0 < 1.0


@pytest.mark.slow
def test_the_python_tool_in_the_tools_environment():
    env = ToolEnv(tools=["calculator", "python"], python={"cpu_s": 1, "wall_s": 3})
    assert env.stop_strings == ["</calc>", "</python>"]
    obs = env.start({}).step("Let me compute: <python>print(sum(range(10)))</python>", ended_by_eos=False)
    assert obs.text == "<result>45</result>" and obs.counts["tool_calls"] == 1
    obs = env.start({}).step("<python>while True: pass</python>", ended_by_eos=False)
    assert obs.text == "<result>error: CPU time limit (1 s)</result>" and obs.counts["tool_timeouts"] == 1
    with pytest.raises(ValueError, match="python is not one of"):
        ToolEnv(tools=["calculator"], python={"cpu_s": 1})
    with pytest.raises(ValueError, match="python.cpu_s: must be > 0"):
        ToolEnv(tools=["python"], python={"cpu_s": 0})
    with pytest.raises(ValueError, match="rollout.env_options.python: .*unexpected keyword"):
        ToolEnv(tools=["python"], python={"gpu": 1})
