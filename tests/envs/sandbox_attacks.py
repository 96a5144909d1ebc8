"""Attacks on the ``python`` tool, as the model's code would make them (tests/envs/test_sandbox.py).

Run as a script (``python sandbox_attacks.py PKG_DIR``) it imports grpokit's sandbox modules from
``PKG_DIR`` (a copy of ``grpokit/envs`` only: standard library), makes every attack and prints one
JSON object ``{attack: output}``: the test runs it as root in-process and as an unprivileged user.
Targets are only what the caller made: a file, a listener on 127.0.0.1, a unix socket. Every loop is
bounded.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading

SECRET = "grpokit-test-secret-7f3a"


def attacks(tmp: str, tcp_port: int, unix_path: str, target: str) -> dict[str, str]:
    """``{name: code}``: each an attempt that the sandbox must refuse."""
    return {
        "proc_root_write": (
            "import os\nhits = []\n"
            "for p in [os.getppid(), 1, 2] + [int(d) for d in os.listdir('/proc') if d.isdigit()][:50]:\n"
            f"    try:\n        open(f'/proc/{{p}}/root{target}', 'a').write('pwned'); hits.append(p)\n"
            "    except OSError as e:\n        pass\n"
            f"try:\n    open({target!r}, 'a').write('pwned'); hits.append('direct')\nexcept OSError:\n    pass\n"
            "print('written', hits)"
        ),
        "remount": (
            "import subprocess\n"
            "r = subprocess.run(['mount', '-o', 'remount,rw', '/'], capture_output=True, text=True)\n"
            "r2 = subprocess.run(['mount', '-o', 'remount,rw', '/usr'], capture_output=True, text=True)\n"
            "ok = []\n"
            "for p in ('/usr/pwned', '/pwned', '/proc/sys/kernel/hostname'):\n"
            "    try:\n        open(p, 'w').write('x'); ok.append(p)\n    except OSError:\n        pass\n"
            "print('mount', r.returncode, r2.returncode, 'written', ok)"
        ),
        "secrets": (
            "import os\nseen = []\n"
            "for d in os.listdir('/proc'):\n"
            "    if d.isdigit():\n"
            "        for f in ('environ', 'cmdline'):\n"
            "            try:\n                seen.append(open(f'/proc/{d}/{f}', 'rb').read().decode('latin-1'))\n"
            "            except OSError:\n                pass\n"
            "try:\n    seen.append(open('/etc/shadow').read())\nexcept OSError:\n    pass\n"
            f"print('found' if any({SECRET!r} in s or 'root:' in s for s in seen) else 'none', len(seen))"
        ),
        "network": (
            "import ctypes, os, socket\nout = []\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "for d in [x for x in os.listdir('/proc') if x.isdigit()][:50]:\n"
            "    try:\n        fd = os.open(f'/proc/{d}/ns/net', os.O_RDONLY)\n"
            "        out.append(('setns', d, libc.setns(fd, 0)))\n    except OSError:\n        pass\n"
            "for fam, kind in ((socket.AF_INET, socket.SOCK_STREAM),):\n"
            "    s = socket.socket(fam, kind); s.settimeout(1)\n"
            f"    try:\n        s.connect(('127.0.0.1', {tcp_port})); out.append('tcp connected')\n"
            "    except OSError as e:\n        out.append(type(e).__name__)\n"
            "u = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    u.connect({unix_path!r}); out.append('unix connected')\n"
            "except OSError as e:\n    out.append(type(e).__name__)\n"
            "print(out)"
        ),
        "privileges": (
            "import ctypes, os, resource\nout = []\n"
            "s = open('/proc/self/status').read()\n"
            "out += [l.split()[1] for l in s.splitlines() if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\n"
            "try:\n    os.chroot('/'); out.append('chroot')\n"
            "except OSError as e:\n    out.append(type(e).__name__)\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)\n"
            "try:\n    resource.setrlimit(resource.RLIMIT_NPROC, (hard + 1, hard + 1)); out.append('raised')\n"
            "except (ValueError, OSError) as e:\n    out.append(type(e).__name__)\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "traced = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH to the namespace's init\n"
            "if traced == 0:  # the sandbox's own init (an ordinary user's run): let it go again\n"
            "    import signal, time; time.sleep(0.05); libc.ptrace(17, 1, None, 0); os.kill(1, signal.SIGCONT)\n"
            "out.append(traced)\n"
            "nested = libc.unshare(0x10000000 | 0x00020000)  # CLONE_NEWUSER | CLONE_NEWNS\n"
            "remount = libc.mount(None, b'/usr', None, 0x20 | 0x1000, None)  # MS_REMOUNT | MS_BIND, rw\n"
            "try:\n    open('/usr/pwned', 'w'); out.append('written')\n"
            "except OSError as e:\n    out.append(type(e).__name__)\n"
            "print(out + [nested, remount])"
        ),
        "setsid_daemon": (
            "import os, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        os.execv('/bin/sleep', ['sleep', '31.4159'])\n    os._exit(0)\n"
            "time.sleep(0.3)\nprint('parent done')"
        ),
    }


def run_all(pkg: str | None = None) -> dict[str, str]:
    """Every attack, with the caller's own targets (made and removed here)."""
    if pkg is not None:
        sys.path.insert(0, pkg)
    from grpokit.envs.python_tool import PythonLimits, run_python

    os.environ["GRPOKIT_TEST_SECRET"] = SECRET
    tmp = tempfile.mkdtemp(prefix="grpokit-attack-")
    target = os.path.join(tmp, "checkpoint.txt")
    with open(target, "w") as f:
        f.write("original")
    os.chmod(tmp, 0o777)
    os.chmod(target, 0o666)  # writable by anyone: only the sandbox stands between
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(5)
    accepted: list[str] = []

    def accept() -> None:
        try:
            srv.accept()
            accepted.append("tcp")
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    unix_path = os.path.join(tmp, "host.sock")
    usrv = socket.socket(socket.AF_UNIX)
    usrv.bind(unix_path)
    usrv.listen(1)
    os.chmod(unix_path, 0o777)
    results: dict[str, str] = {}
    limits = PythonLimits(cpu_s=2, wall_s=8, sandbox="required")
    for name, code in attacks(tmp, srv.getsockname()[1], unix_path, target).items():
        results[name] = run_python(code, limits)[0]
    with open(target) as f:
        results["target_after"] = f.read()
    results["accepted"] = ",".join(accepted)
    srv.close()
    usrv.close()
    return results


if __name__ == "__main__":
    print(json.dumps(run_all(sys.argv[1])))
