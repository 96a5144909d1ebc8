"""grpokit.utils.threads: the thread count is the cores other work leaves free, the user's
OMP_NUM_THREADS and GRPOKIT_THREADS win, and the choice is said in one line."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from grpokit.utils import threads


@pytest.mark.serial
def test_busy_cores_sees_a_spinning_process_and_not_this_one():
    import threading

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        busy = threads.busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert 0.7 < busy < 1.4
    done = time.monotonic() + 0.8

    def own():  # a thread of this process busy during the window: not other work
        while time.monotonic() < done:
            pass

    worker = threading.Thread(target=own)
    worker.start()
    try:
        assert threads.busy_cores(0.5) < 0.5
    finally:
        worker.join()


def _choice(monkeypatch, env, *, usable=2, busy=0.0, default=2):
    monkeypatch.setattr(threads, "usable_cores", lambda: usable)
    monkeypatch.setattr(threads, "busy_cores", lambda window_s: busy)
    monkeypatch.setattr(threads, "_torch_default", lambda: default)
    return threads.choose_threads(env)


@pytest.mark.parametrize(
    ("usable", "busy", "default", "want"),
    [(2, 0.0, 2, 2), (2, 0.4, 2, 2), (2, 0.6, 2, 1), (2, 2.0, 2, 1), (2, 5.0, 2, 1), (8, 2.2, 4, 4), (8, 5.1, 4, 3)],
)
def test_auto_takes_the_free_cores(monkeypatch, usable, busy, default, want):
    c = _choice(monkeypatch, {}, usable=usable, busy=busy, default=default)
    assert (c.threads, c.source, c.usable, c.busy) == (want, "auto", usable, busy)
    assert c.line().startswith(f"threads: {want} of {usable} usable cores ({busy:.1f} busy with other work)")


def test_the_users_setting_wins_and_nothing_is_measured(monkeypatch):
    def never(window_s):
        raise AssertionError("measured")

    monkeypatch.setattr(threads, "busy_cores", never)
    c = threads.choose_threads({"OMP_NUM_THREADS": "3", "GRPOKIT_THREADS": "1", "OMP_WAIT_POLICY": "active"})
    assert c.threads is None and c.source == "OMP_NUM_THREADS"
    assert c.line().endswith("OpenMP wait policy active")
    assert threads.choose_threads({"GRPOKIT_THREADS": "3"}).threads == 3
    off = threads.choose_threads({"GRPOKIT_THREADS": "off", "OMP_WAIT_POLICY": "PASSIVE"})
    assert off.threads is None and "GRPOKIT_THREADS=off" in off.line()
    assert off.line().endswith("OpenMP threads sleep while waiting (OMP_WAIT_POLICY=PASSIVE)")
    with pytest.raises(ValueError, match=r"GRPOKIT_THREADS='two': expected auto, off or a positive integer"):
        threads.choose_threads({"GRPOKIT_THREADS": "two"})


@pytest.mark.parametrize(("busy", "policy"), [(0.2, None), (0.6, "PASSIVE"), (1.8, "PASSIVE")])
def test_a_busy_machine_gets_sleeping_openmp_threads(monkeypatch, busy, policy):
    """prepare_environment (before torch loads): PASSIVE where other work keeps ≥ half a core busy,
    the runtime's default on an idle machine; the user's policy is kept; apply_threads reuses it."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("GRPOKIT_THREADS", "auto")
    monkeypatch.setattr(threads, "_EARLY", [])
    c = _choice(monkeypatch, None, busy=busy) and threads.prepare_environment()
    assert c.wait_policy == policy and threads.os.environ.get("OMP_WAIT_POLICY") == policy
    assert threads._EARLY == [c] and c.threads == (2 if busy < 0.5 else 1)
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert threads.prepare_environment().wait_policy == "active" and threads.os.environ["OMP_WAIT_POLICY"] == "active"


def test_the_cgroup_quota_caps_the_usable_cores(monkeypatch):
    monkeypatch.setattr(threads, "_quota", lambda: 1.5)
    assert threads.usable_cores() == 1


@pytest.mark.e2e
def test_a_run_says_its_choice_first_and_sets_torch(tiny_model_dir, tmp_path):
    """In a fresh process (the wait policy must be set before torch loads): ``grpokit train`` with
    GRPOKIT_THREADS=1 sets torch's count and the policy, says so in its first line and records
    ``threads`` in metrics.jsonl; --no-progress prints one line per step and no bars."""
    import os

    from support.helpers import tiny_recipe_dict, write_recipe

    code = (
        "import sys\nfrom grpokit.cli.main import main\nrc = main(sys.argv[1:])\n"
        "import os, torch\nprint('torch threads', torch.get_num_threads(), os.environ.get('OMP_WAIT_POLICY'))\n"
        "sys.exit(rc)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")} | {"GRPOKIT_THREADS": "1"}
    raw = tiny_recipe_dict(
        tiny_model_dir, tmp_path / "run", train={"max_steps": 2}, rewards={"functions": ["number_at_end"]}
    )
    recipe = write_recipe(tmp_path / "r.yaml", raw)
    run = subprocess.run(
        [sys.executable, "-c", code, "train", str(recipe), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == (
        "[grpokit] threads: 1 (GRPOKIT_THREADS set; "
        f"{threads.usable_cores()} usable cores); OpenMP wait policy default (spin, then sleep)"
    )
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1/2", "2/2"] and all(s.endswith(" s") for s in steps)
    assert lines[-1] == "torch threads 1 None"
    assert "Loading weights" not in run.stderr and "it/s" not in run.stderr and "grpo:" not in run.stderr
    import json

    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["threads"] for r in rows] == [1, 1]
    for r, s in zip(rows, steps):
        assert s == f"step {r['step']}/2  reward {r['reward_mean']:.3f}  loss {r['loss']:.4f}  {r['step_s']:.1f} s"
