"""Reliability of a training run: exact resume after SIGKILL, SIGTERM, reward and numerical
faults, bad input rejected before the model loads, safe defaults.

Runs a tiny random Llama (``tiny_model_dir``) with the fake rewards of ``tests/support/fake_rewards.py``.
The process tests fork ``python -m grpokit`` from a warm server (``rank_forker``, one torch
thread), ~2 s apiece.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import grpokit.models.loading
import grpokit.trainer.build
import grpokit.trainer.loop
import grpokit.trainer.stopping
from grpokit import algo
from grpokit.cli.main import main
from grpokit.config import recipe_from_dict
from grpokit.metrics import read_metrics
from grpokit.trainer.loop import train
from support.helpers import tiny_recipe, tiny_recipe_dict, write_recipe


def _argv(recipe_path: Path, *overrides: str) -> list[str]:
    """``python -m grpokit`` arguments; the process is forked by ``rank_forker`` (nprocs=0)."""
    return ["train", str(recipe_path), "--no-progress", *overrides]


def _wait_for(path: Path, launch, timeout: float = 120.0) -> None:
    """Wait until ``path`` exists; fail if the run ends first or ``timeout`` passes."""
    if not launch.wait_for_file(path, timeout):
        if launch.poll() is not None:
            pytest.fail(f"run ended (rc {launch.returncodes}) before {path.name} appeared:\n{launch.log}")
        launch.kill()
        pytest.fail(f"{path} did not appear within {timeout} s")


def _kill_when(path: Path, launch, timeout: float = 180.0) -> None:
    """SIGKILL the forked run as soon as ``path`` exists (polled every 5 ms)."""
    launch.wait_for_file(path, timeout)
    launch.kill()


def _steps(path: Path) -> list[int]:
    return [json.loads(l)["step"] for l in path.read_text().splitlines() if l.strip()]


# -- exact resume -------------------------------------------------------------------------------


@pytest.mark.e2e
def test_sigkill_then_resume_matches_uninterrupted_run(tiny_model_dir, tmp_path, rank_forker):
    """Kill -9 a CLI run right after checkpoint-2 is visible, resume it with train.resume=auto,
    and get the same rewards (exactly) and losses as a run that was never interrupted."""
    sections = {"train": {"max_steps": 4, "save_steps": 1, "save_total_limit": 3}}
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    recipe = write_recipe(tmp_path / "part.yaml", tiny_recipe_dict(tiny_model_dir, part_dir, **sections))
    launch = rank_forker.start(_argv(recipe), tmp_path / "log", nprocs=0)
    killer = threading.Thread(target=_kill_when, args=(part_dir / "checkpoint-2", launch), daemon=True)
    killer.start()
    torch.set_num_threads(1)  # as the forked run (OMP_NUM_THREADS=1): same float results
    train(tiny_recipe(tiny_model_dir, full_dir, **sections), progress=False)  # meanwhile
    killer.join(timeout=180)
    (rc,) = launch.wait(60)
    assert rc == -signal.SIGKILL, f"not killed mid-run (rc {rc}):\n{launch.log}"
    assert (part_dir / "checkpoint-2").is_dir() and not (part_dir / "checkpoint-4").exists()

    summary = train(recipe_from_dict(yaml.safe_load(recipe.read_text())), progress=False)  # resume=auto
    assert Path(summary["resumed_from"]).name in ("checkpoint-2", "checkpoint-3")

    full, part = read_metrics(full_dir / "metrics.jsonl"), read_metrics(part_dir / "metrics.jsonl")
    assert [m["step"] for m in part] == [1, 2, 3, 4]  # no duplicate or missing steps
    for a, b in zip(full, part, strict=True):
        assert a["reward_mean"] == b["reward_mean"], a["step"]
        assert a["rewards/length_reward"] == b["rewards/length_reward"]
        assert a["completion_len_mean"] == b["completion_len_mean"]
        for k in ("loss", "kl", "grad_norm", "lr"):
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), (a["step"], k)
    samples = _steps(part_dir / "samples.jsonl")
    assert samples == sorted(samples) and len(samples) == len(_steps(full_dir / "samples.jsonl"))
    # the final weights agree too
    wa = load_file(full_dir / "checkpoint-4" / "model.safetensors")
    wb = load_file(part_dir / "checkpoint-4" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_resume_drops_torn_and_later_metric_lines(tiny_model_dir, tmp_path):
    """A metrics line of a step after the checkpoint, or one half-written by a kill, is dropped."""
    sections = {"train": {"max_steps": 2, "save_steps": 1}, "algo": {"beta": 0.0}}
    train(tiny_recipe(tiny_model_dir, tmp_path, **sections), progress=False)
    import shutil

    shutil.rmtree(tmp_path / "checkpoint-2")
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward_me')  # torn by a kill
    train(tiny_recipe(tiny_model_dir, tmp_path, **sections), progress=False)
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2]
    assert sorted(set(_steps(tmp_path / "samples.jsonl"))) == [1, 2]


# -- SIGTERM ------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_sigterm_stops_at_step_boundary_with_checkpoint(tiny_model_dir, tmp_path, rank_forker):
    out = tmp_path / "run"
    raw = tiny_recipe_dict(tiny_model_dir, out, train={"max_steps": 200, "save_steps": 0}, algo={"beta": 0.0})
    launch = rank_forker.start(_argv(write_recipe(tmp_path / "r.yaml", raw)), tmp_path / "log", nprocs=0)
    _wait_for(out / "metrics.jsonl", launch)  # step 1 done: in the middle of the loop
    launch.kill(signal.SIGTERM)
    (rc,) = launch.wait(120)
    log = launch.log
    assert rc == 143, log[-3000:]  # 128 + SIGTERM: `grpokit train && grpokit eval` stops here
    steps = _steps(out / "metrics.jsonl")
    stop = steps[-1]
    assert f"[grpokit] stopped at step {stop} of 200; run the same command to continue\n" in log
    assert steps == list(range(1, stop + 1)) and stop < 200
    assert [p.name for p in out.glob("checkpoint-*")] == [f"checkpoint-{stop}"]
    assert json.loads((out / f"checkpoint-{stop}" / "trainer_state.json").read_text())["step"] == stop
    assert json.loads((out / "summary.json").read_text())["stopped_at"] == stop
    assert "signal" in log


def _stop_during_step(monkeypatch, step: int, *signals: int) -> None:
    """Send ``signals`` to this process at the start of step ``step`` (each handled before the next)."""
    real = grpokit.trainer.loop.run_step

    def run_step(run, *a, **k):
        if run.state.step + 1 == step:
            for s in signals:
                os.kill(os.getpid(), s)
                time.sleep(0)  # a call: the handler of one signal runs before the next is sent
        return real(run, *a, **k)

    monkeypatch.setattr(grpokit.trainer.loop, "run_step", run_step)


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_finishes_the_step_checkpoints_and_exits_128_plus_its_number(
    tiny_model_dir, tmp_path, capsys, monkeypatch, sig, status
):
    out = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tiny_recipe_dict(tiny_model_dir, out, algo={"beta": 0.0}, train={"max_steps": 5, "save_steps": 0}),
    )
    _stop_during_step(monkeypatch, 2, sig)
    handler = signal.getsignal(sig)
    assert main(["train", str(recipe), "--no-progress"]) == status
    assert signal.getsignal(sig) == handler  # put back after the run
    printed = capsys.readouterr().out
    assert "[grpokit] stopped at step 2 of 5; run the same command to continue\n" in printed
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"] and _steps(out / "metrics.jsonl") == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stopped_at"], summary["stop_signal"]) == (2, sig)


@pytest.mark.slow
def test_a_signal_stopping_trainer_train_says_to_call_it_again(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """From Python the stop line says what continues the run there (not "run the same command"), and
    calling train() again does."""
    out = tmp_path / "run"
    recipe = tiny_recipe_dict(tiny_model_dir, out, algo={"beta": 0.0}, train={"max_steps": 3, "save_steps": 0})
    _stop_during_step(monkeypatch, 2, signal.SIGINT)
    trainer = grpokit.Trainer(recipe, progress=False)
    assert trainer.train()["stopped_at"] == 2
    assert "[grpokit] stopped at step 2 of 3; call train() again to continue\n" in capsys.readouterr().out
    monkeypatch.undo()
    assert trainer.train()["last_metrics"]["step"] == 3 and _steps(out / "metrics.jsonl") == [1, 2, 3]


@pytest.mark.slow
def test_a_signal_to_another_rank_stops_this_one_with_that_status(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """Under torchrun every rank learns of a stop through ``any_rank`` and takes the signaled rank's number."""
    monkeypatch.setattr(grpokit.trainer.loop, "any_rank", lambda flag, ranks: True)  # rank 1 got a SIGTERM
    monkeypatch.setattr(grpokit.trainer.stopping, "gather_objects", lambda obj, ranks: [obj, int(signal.SIGTERM)])
    out = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_recipe_dict(tiny_model_dir, out, algo={"beta": 0.0}, train={"max_steps": 5})
    )
    assert main(["train", str(recipe), "--no-progress", "train.resume=none"]) == 143
    assert (
        "[grpokit] stopped at step 1 of 5; continue with train.resume=auto (this command has train.resume=none)"
        in capsys.readouterr().out
    )
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-1"]


def test_a_second_signal_stops_at_once_with_one_line(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tiny_model_dir, out, algo={"beta": 0.0}))
    _stop_during_step(monkeypatch, 1, signal.SIGTERM, signal.SIGTERM)
    assert main(["train", str(recipe), "--no-progress"]) == 143
    err = capsys.readouterr().err  # --no-progress: no bar of the model load before it either
    assert err == (
        "grpokit train: interrupted (SIGTERM); the step under way was not saved (train.resume=auto "
        "continues from the newest checkpoint, if any)\n"
    )
    assert not list(out.glob("checkpoint-*"))


# -- a finished run -----------------------------------------------------------------------------


@pytest.mark.slow
def test_rerunning_a_finished_run_loads_nothing_and_writes_nothing(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_recipe_dict(tiny_model_dir, out, algo={"beta": 0.0}, train={"max_steps": 1})
    )
    assert main(["train", str(recipe), "--no-progress"]) == 0
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    assert json.loads((out / "summary.json").read_text())["last_metrics"]["step"] == 1
    capsys.readouterr()
    for name in ("load_model", "load_tokenizer"):
        monkeypatch.setattr(grpokit.models.loading, name, lambda *a, **k: pytest.fail("loaded"))
    assert main(["train", str(recipe), "--no-progress", "data.limit=4"]) == 0
    assert capsys.readouterr().out == (
        f"[grpokit] {out / 'checkpoint-1'} is already at train.max_steps=1, nothing to do (raise train.max_steps to "
        "continue; train.resume=none or a new train.output_dir to start over); not used, as they differ from the "
        "run's: data.limit=4 (the run's: 8)\n"
    )
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == before


# -- reward faults ------------------------------------------------------------------------------


def _run(tiny_model_dir, out, **sections):
    return train(tiny_recipe(tiny_model_dir, out, **sections), progress=False)


@pytest.mark.slow
def test_raising_reward_stops_the_run_naming_function_row_and_error(tiny_model_dir, tmp_path):
    with pytest.raises(RuntimeError) as e:
        _run(tiny_model_dir, tmp_path, rewards={"functions": ["support.fake_rewards:raising_reward"]})
    msg = str(e.value)
    assert "support.fake_rewards:raising_reward" in msg and "row 1" in msg and "ZeroDivisionError" in msg
    assert "rewards.on_error=none" in msg  # says how to continue instead
    assert not list(tmp_path.glob("checkpoint-*"))


@pytest.mark.slow
def test_raising_reward_with_on_error_none_scores_none_and_counts(tiny_model_dir, tmp_path):
    _run(tiny_model_dir, tmp_path, rewards={"functions": ["support.fake_rewards:raising_reward"], "on_error": "none"})
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["reward_failures"] == 1  # one bad row per reward call
        assert m["unscorable_frac"] == pytest.approx(1 / 4)  # of N = B*G = 4 rows
        assert math.isfinite(m["loss"]) and m["skipped_updates"] == 0
    rewards = [json.loads(l)["reward"] for l in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert rewards.count(None) == 2


@pytest.mark.slow
def test_hanging_reward_is_cut_off_by_the_timeout(tiny_model_dir, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"hanging_reward.*row 1.*timed out after 0.5 s"):
        _run(
            tiny_model_dir,
            tmp_path / "a",
            rewards={"functions": ["support.fake_rewards:hanging_reward"], "timeout_s": 0.5},
        )
    _run(
        tiny_model_dir,
        tmp_path / "b",
        rewards={"functions": ["support.fake_rewards:hanging_reward"], "timeout_s": 0.5, "on_error": "none"},
        train={"max_steps": 1},
    )
    m = read_metrics(tmp_path / "b" / "metrics.jsonl")[0]
    assert m["reward_failures"] == 1 and m["unscorable_frac"] == pytest.approx(1 / 4)
    assert m["reward_s"] < 1.9  # two 0.5 s limits (batch call, then the bad row), not 2 s sleeps
    assert time.perf_counter() - t0 < 30


@pytest.mark.slow
@pytest.mark.parametrize("fn, frac", [("nan_reward", 0.5), ("inf_reward", 0.125)])
def test_unscorable_rewards_get_zero_advantage(tiny_model_dir, tmp_path, monkeypatch, fn, frac):
    seen = []
    real = grpokit.trainer.loop.sample_and_score

    def spy(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    monkeypatch.setattr(grpokit.trainer.loop, "sample_and_score", spy)
    _run(
        tiny_model_dir,
        tmp_path,
        rewards={"functions": [f"support.fake_rewards:{fn}"]},
        rollout={"group_size": 4},
        train={"max_steps": 1},
    )
    exp = seen[0].experience  # run_step sets its advantages (step 4)
    rewards, adv = exp.rewards, exp.advantages
    bad = ~torch.isfinite(rewards)
    assert bad.float().mean().item() == frac
    assert torch.isfinite(adv).all()
    assert (adv[bad] == 0).all() and (adv[~bad] != 0).any()
    m = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert m["unscorable_frac"] == frac and m["reward_failures"] == 0
    assert math.isfinite(m["reward_mean"]) and math.isfinite(m["loss"])
    samples = [json.loads(l) for l in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sum(s["reward"] is None for s in samples) == int(frac * 8)
    scored = [s["reward"] for s in samples if s["reward"] is not None]  # one function, weight 1
    assert m[f"rewards/{fn}"] == pytest.approx(sum(scored) / len(scored))  # over the rows the total counts


# -- numerical faults ---------------------------------------------------------------------------


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _capture_setup(monkeypatch) -> dict:
    seen = {}
    real = grpokit.trainer.build.build_run

    def spy(r):
        seen["s"] = real(r)
        seen["w0"] = _weights(seen["s"].model)
        return seen["s"]

    monkeypatch.setattr(grpokit.trainer.loop, "build_run", spy)
    return seen


def test_non_finite_loss_skips_updates_then_stops(tiny_model_dir, tmp_path, monkeypatch):
    """NaN advantages -> NaN loss and gradients: no optimizer step, logged, and the run stops after
    train.max_consecutive_skips skips in a row; weights and checkpoints stay finite."""
    seen = _capture_setup(monkeypatch)
    monkeypatch.setattr(algo, "outcome_advantages", lambda r, g, **k: torch.full_like(r, math.nan))
    with pytest.raises(RuntimeError, match="2 consecutive non-finite updates.*step 2"):
        _run(tiny_model_dir, tmp_path, train={"max_steps": 5, "save_steps": 1, "max_consecutive_skips": 2})
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["skipped_updates"] == 1 and m["loss"] is None for m in lines)
    model = seen["s"].model
    for k, v in model.state_dict().items():
        assert torch.equal(v, seen["w0"][k]), k  # untouched, hence finite
    assert all(p.grad is None for p in model.parameters())
    assert json.loads((tmp_path / "checkpoint-1" / "trainer_state.json").read_text())["consecutive_skips"] == 1
    for ckpt in tmp_path.glob("checkpoint-*"):
        for k, v in load_file(ckpt / "model.safetensors").items():
            assert torch.isfinite(v).all(), (ckpt.name, k)


@pytest.mark.slow
def test_one_non_finite_grad_norm_skips_one_update_and_continues(tiny_model_dir, tmp_path, monkeypatch):
    seen = _capture_setup(monkeypatch)
    real = torch.nn.utils.clip_grad_norm_
    calls = []

    def clip(params, max_norm, *a, **k):
        calls.append(1)
        norm = real(params, max_norm, *a, **k)
        if len(calls) == 1:
            seen["w1"] = _weights(seen["s"].model)
            return torch.tensor(math.inf)
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    _run(tiny_model_dir, tmp_path, algo={"beta": 0.0}, train={"max_steps": 3})
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["skipped_updates"] for m in lines] == [1, 0, 0]
    assert lines[0]["grad_norm"] is None and math.isfinite(lines[1]["grad_norm"])
    # step 1's update was skipped; steps 2 and 3 trained
    s = seen["s"]
    assert all(torch.equal(seen["w1"][k], seen["w0"][k]) for k in seen["w0"])
    assert any(not torch.equal(v, seen["w0"][k]) for k, v in s.model.state_dict().items())
    assert s.state.consecutive_skips == 0


# -- bad input is rejected before the model loads -----------------------------------------------


@pytest.mark.parametrize(
    "sections, names",
    [
        ({"train": {"max_stepz": 1}}, ["train.max_stepz"]),
        ({"train": {"max_steps": "two"}}, ["train.max_steps", "integer"]),
        ({"rollout": {"group_size": 1}}, ["rollout.group_size", ">= 2"]),
        ({"rollout": {"max_new_tokens": 0}}, ["rollout.max_new_tokens", "> 0"]),
        ({"train": {"prompts_per_step": 0}}, ["train.prompts_per_step", "> 0"]),
        ({"data": {"max_prompt_tokens": -3}}, ["data.max_prompt_tokens", "> 0"]),
        ({"algo": {"clip_eps_low": -0.2}}, ["algo.clip_eps_low", ">= 0"]),
        ({"algo": {"beta": -1.0}}, ["algo.beta", ">= 0"]),
    ],
)
def test_bad_recipe_values_exit_2_before_loading(tiny_model_dir, tmp_path, capsys, no_model_load, sections, names):
    raw = tiny_recipe_dict(tiny_model_dir, tmp_path / "out")
    for sec, vals in sections.items():
        raw.setdefault(sec, {}).update(vals)
    assert main(["train", str(write_recipe(tmp_path / "r.yaml", raw))]) == 2
    err = capsys.readouterr().err
    for n in names:
        assert n in err, err
    assert not (tmp_path / "out").exists()


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "case",
    [
        "dataset",
        "split",
        "column",
        "empty_prompt",
        "eval_dataset",
        "reward",
        "reward_import",
        "reward_attr",
        "process_reward",
        "process_reward_import",
        "process_reward_attr",
        "step_rule",
        "missing_file",
        "resume",
    ],
)
def test_bad_input_fails_before_the_model_loads(tiny_model_dir, tmp_path, capsys, no_model_load, case):
    good = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]
    sections, names = {
        "dataset": ({"data": {"dataset": "gsm9k"}}, ["data.dataset", "gsm9k", "gsm8k", "mawps"]),
        "split": ({"data": {"split": "validation"}}, ["data.split", "validation", "singleop"]),
        "column": (
            {"data": {"dataset": _jsonl(tmp_path / "d.jsonl", [{"q": "1+1?", "answer": "2"}]), "split": "train"}},
            ["row 0", "prompt", "'q'"],
        ),
        "empty_prompt": (
            {
                "data": {
                    "dataset": _jsonl(tmp_path / "e.jsonl", good + [{"question": " ", "answer": "1"}]),
                    "split": "train",
                }
            },
            ["row 2", "empty prompt"],
        ),
        "eval_dataset": ({"eval": {"dataset": "mawps", "split": "nope"}}, ["eval.split", "nope", "test"]),
        "reward": ({"rewards": {"functions": ["math_corect"]}}, ["rewards.functions", "math_corect", "math_correct"]),
        "reward_import": (
            {"rewards": {"functions": ["no_such_module_xyz:f"]}},
            ["rewards.functions", "no_such_module_xyz", "cannot import"],
        ),
        "reward_attr": (
            {"rewards": {"functions": ["support.fake_rewards:nope"]}},
            ["support.fake_rewards:nope", "length_reward"],
        ),
        "process_reward": (
            {"algo": {"supervision": "process", "process_reward": "nope"}},
            ["algo.process_reward", "arithmetic"],
        ),
        "process_reward_import": (
            {"algo": {"supervision": "process", "process_reward": "no_such_module_xyz:f"}},
            ["algo.process_reward: process reward 'no_such_module_xyz:f': cannot import"],
        ),
        "process_reward_attr": (
            {"algo": {"supervision": "process", "process_reward": "support.fake_rewards:nope"}},
            ["algo.process_reward: process reward 'support.fake_rewards:nope'", "length_reward"],
        ),
        "step_rule": (
            {"algo": {"supervision": "process", "step_rule": "sentences"}},
            ["algo.step_rule", "sentences", "lines"],
        ),
        "missing_file": ({"data": {"dataset": str(tmp_path / "missing.jsonl")}}, ["data.dataset", "missing.jsonl"]),
        "resume": ({"train": {"resume": str(tmp_path / "checkpoint-9")}}, ["train.resume", "checkpoint-9"]),
    }[case]
    raw = tiny_recipe_dict(tiny_model_dir, tmp_path / "out", **sections)
    assert main(["train", str(write_recipe(tmp_path / "r.yaml", raw)), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("grpokit train: error:"), err
    for n in names:
        assert n in err, (n, err)


# -- safety -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_remote_code_is_off_and_checkpoints_are_safetensors(tiny_model_dir, tmp_path, monkeypatch):
    seen = []
    real_model, real_tok = grpokit.models.loading.load_model, grpokit.models.loading.load_tokenizer

    def model_spy(*a, **k):
        seen.append(("model", k.get("trust_remote_code")))
        return real_model(*a, **k)

    def tok_spy(*a, **k):
        seen.append(("tokenizer", k.get("trust_remote_code")))
        return real_tok(*a, **k)

    monkeypatch.setattr(grpokit.models.loading, "load_model", model_spy)
    monkeypatch.setattr(grpokit.models.loading, "load_tokenizer", tok_spy)
    assert recipe_from_dict({}).model.trust_remote_code is False
    _run(tiny_model_dir, tmp_path, train={"max_steps": 1})
    assert seen == [("tokenizer", False), ("model", False), ("model", False)]  # policy + reference
    files = [p.name for p in (tmp_path / "checkpoint-1").iterdir()]
    assert "model.safetensors" in files and not [f for f in files if f.endswith(".bin")]
