"""GuardedReward: the time limit holds whatever the reward function does (issue: a math check on
``9^{9^{9}}`` hung past its timeout, because a thread cannot cut off a call that holds the GIL)."""

from __future__ import annotations

import os
import time

import pytest

from grpokit.rewards.guard import GuardedReward, RewardError
from grpokit.rewards.math import math_correct
from support import fake_rewards as fr


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an exited process nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _timed(fn, *a, **k):
    t0 = time.monotonic()
    out = fn(*a, **k)
    return out, time.monotonic() - t0


def test_math_check_on_a_tower_of_exponents_returns_within_the_timeout():
    guard = GuardedReward("m", math_correct, timeout_s=2, on_error="none")
    try:
        out, dt = _timed(guard, ["q"], [r"The answer is \boxed{9^{9^{9}}}"], answer=["5"])
    finally:
        guard.close()
    # math-verify's own limit (main thread of the worker) may answer 0.0 first; a hang never returns
    assert out in ([None], [0.0])
    assert dt < 2 * 2 + 3  # batch call + row retry, each cut at 2 s, plus worker starts


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["none", "raise"])
def test_a_call_holding_the_gil_is_cut_off(on_error):
    guard = GuardedReward("hog", fr.gil_holding_reward, timeout_s=0.5, on_error=on_error)
    t0 = time.monotonic()
    try:
        if on_error == "raise":
            with pytest.raises(RewardError, match=r"'hog' failed on row 0 .*timed out after 0.5 s"):
                guard(["q"], ["x"])
        else:
            assert guard(["q"], ["x"]) == [None]
            assert guard.failures == 1
    finally:
        guard.close()
    assert time.monotonic() - t0 < 5  # two 0.5 s limits; without the worker: minutes


def test_thread_isolation_cannot_cut_off_the_gil_but_still_times_out_a_sleep():
    # the former behaviour, kept as an option: a sleeping call is abandoned at the limit
    guard = GuardedReward("hang", fr.hanging_reward, timeout_s=0.3, on_error="none", isolation="thread")
    out, dt = _timed(guard, ["q"] * 3, ["a", "b", "c"])
    assert out == [0.01, None, 0.01] and guard.failures == 1
    assert dt < fr.HANG_S + 1.0


def test_worker_is_reused_between_calls_and_replaced_after_a_kill():
    guard = GuardedReward("pid", fr.pid_reward, timeout_s=5)
    try:
        first = guard(["q"], ["a"])[0]
        assert first != os.getpid()  # not the trainer's process
        assert guard(["q", "q"], ["a", "b"]) == [first, first]  # same worker, no restart per call
        guard.close()
        assert guard(["q"], ["a"])[0] not in (first, os.getpid())  # a fresh worker after a kill
    finally:
        guard.close()


def test_an_exception_keeps_its_type_and_the_worker_traceback():
    guard = GuardedReward("f", fr.raising_reward, timeout_s=5)
    try:
        with pytest.raises(RewardError, match=r"'f' failed on row 1 .*ZeroDivisionError") as e:
            guard(["q"] * 3, ["r0", "r1", "r2"])
        cause = e.value.__cause__
        assert isinstance(cause, ZeroDivisionError)
        assert any("raising_reward" in n for n in cause.__notes__)  # the worker's traceback
    finally:
        guard.close()


def test_a_worker_that_dies_is_an_error_of_its_row_and_the_next_call_works():
    guard = GuardedReward("exit", fr.exiting_reward, timeout_s=5, on_error="none")
    try:
        assert guard(["q", "q"], ["a", "b"]) == [None, None]
        assert guard.failures == 2
    finally:
        guard.close()
    guard = GuardedReward("exit", fr.exiting_reward, timeout_s=5, on_error="raise")
    try:
        with pytest.raises(RewardError, match=r"row 0 .*worker process exited \(code 3\)"):
            guard(["q"], ["a"])
    finally:
        guard.close()


def test_lambdas_and_closures_work_in_the_worker():
    bonus = 0.5
    guard = GuardedReward("closure", lambda p, c, **_: [len(x) + bonus for x in c], timeout_s=5)
    try:
        assert guard(["q", "q"], ["ab", "abcd"]) == [2.5, 4.5]
    finally:
        guard.close()


def test_a_result_that_cannot_be_sent_back_is_an_error_naming_it():
    guard = GuardedReward("gen", lambda p, c, **_: (x for x in [1.0]), timeout_s=5)
    try:
        with pytest.raises(RewardError, match="could not be sent back"):
            guard(["q"], ["a"])
    finally:
        guard.close()


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"on_error": "skip"}, "rewards.on_error"),
        ({"isolation": "none"}, "rewards.isolation"),
        ({"timeout_s": 0}, "rewards.timeout_s"),
    ],
)
def test_bad_arguments_name_the_key(kw, msg):
    with pytest.raises(ValueError, match=msg):
        GuardedReward("f", fr.length_reward, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("busy", [False, True])
def test_worker_ends_when_the_trainer_is_killed(tmp_path, busy):
    """Idle (waiting for a call) or busy (in a call that holds the GIL for minutes): a trainer
    killed with SIGKILL (the OOM killer's signal) takes its worker with it."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "trainer.py"
    call = (
        "print(g._worker.proc.pid, flush=True); g(['q'], ['a'])"
        if busy
        else "print(int(g(['q'], ['a'])[0]), flush=True)"
    )
    fn = "gil_holding_reward" if busy else "pid_reward"
    script.write_text(
        "import sys, time\n"
        "from grpokit.rewards.guard import GuardedReward\n"
        "from support import fake_rewards\n"
        f"g = GuardedReward('r', fake_rewards.{fn}, timeout_s=600)\n"
        f"{call}\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(p) for p in sys.path if p])}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    worker = int(proc.stdout.readline())
    os.kill(worker, 0)  # alive
    time.sleep(0.5)  # busy: the call has reached the worker
    proc.send_signal(signal.SIGKILL)  # no clean-up runs in the trainer
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _running(worker):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"reward worker {worker} outlived its killed trainer")
    assert proc.stdout.read() == ""  # the worker held no copy of the trainer's stdout open


def trl_conversational(prompts, completions, **kwargs):  # TRL's form for conversational data
    return [float(c[0]["content"].strip() == "4") + 0.1 * len(p) for p, c in zip(prompts, completions)]


def test_completions_as_messages_gives_trls_conversational_form():
    """rewards.completions_as=messages: each completion a one-message list, each prompt its row's
    messages (or one user message); scored as the function computes it on those."""
    prompts, completions = ["2+2?", "3+1?"], ["4", "5"]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    for isolation in ("thread", "process"):
        g = GuardedReward("conv", trl_conversational, isolation=isolation, as_messages=True)
        try:
            assert g(prompts, completions) == [1.1, 0.1]  # one user message per prompt
            assert g(prompts, completions, prompt_messages=[system, None]) == [1.2, 0.1]
        finally:
            g.close()


def test_completions_as_auto_follows_the_rows_prompts():
    """auto (None, the recipe's default): TRL's form for a call whose rows gave their prompts as
    messages (a prompt_messages column with a list), text for rows whose prompts were text."""
    chat = [[{"role": "user", "content": "2+2?"}], [{"role": "user", "content": "3+1?"}]]
    g = GuardedReward("conv", trl_conversational, isolation="thread", as_messages=None)
    assert g(["2+2?", "3+1?"], ["4", "5"], prompt_messages=chat) == [1.1, 0.1]
    with pytest.raises(RewardError, match=r"got are text"):  # text rows: text, as with TRL's plain datasets
        g(["2+2?"], ["4"], prompt_messages=[None])
    with pytest.raises(RewardError, match=r"got are text"):
        g(["2+2?"], ["4"])


def test_a_form_mismatch_is_told_of_completions_as_not_on_error():
    """A TRL conversational function given text fails on every row: the message says which form it got
    and the key that gives the other, not rewards.on_error=none."""
    g = GuardedReward("conv", trl_conversational, isolation="thread")
    with pytest.raises(
        RewardError,
        match=r"row 0 .*The completions it got are text; if it reads messages, set "
        r"rewards.completions_as=messages \(Python: overrides=\{'rewards.completions_as': 'messages'\}\)\.$",
    ):
        g(["2+2?"], ["4"])

    def text_only(prompts, completions, **_):
        return [float(c.strip() == "4") for c in completions]

    g = GuardedReward("txt", text_only, isolation="thread", as_messages=True)
    with pytest.raises(RewardError, match=r"got are messages; .* set rewards.completions_as=text \(Python: .*\)\.$"):
        g(["2+2?"], ["4"])
    g = GuardedReward("zero", lambda p, c, **_: [1 / 0], isolation="thread")
    with pytest.raises(RewardError, match=r"If only some rows make it fail, rewards.on_error=none"):
        g(["q"], ["c"])


def test_completions_as_messages_reaches_own_functions_only(tmp_path):
    """From the recipe: the user's function gets TRL's conversational form, a built-in still gets text."""
    from grpokit.rewards.pipeline import RewardPipeline
    from support.helpers import tiny_recipe

    recipe = tiny_recipe(
        "unused-model",
        tmp_path,
        rewards={
            "functions": ["test_guard:trl_conversational", "math_correct"],
            "isolation": "thread",
            "completions_as": "messages",
        },
    )
    pipe = RewardPipeline.from_config(recipe.rewards)
    try:
        own, builtin = pipe.funcs.values()
        assert own.as_messages and not builtin.as_messages
        assert own(["2+2?"], ["4"]) == [1.1] and builtin(["2+2?"], [r"\boxed{4}"], answer=["4"]) == [1.0]
    finally:
        pipe.close()
