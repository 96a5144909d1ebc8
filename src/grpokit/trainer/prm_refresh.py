"""Iterative RL with a learned PRM (DeepSeekMath, arXiv 2402.03300, §4.1.3): as the policy moves, the
PRM is retrained on labels of the policy's own new samples, with a replay of earlier labels, and the
reference model is set to the policy.

With ``prm.refresh_steps = K > 0`` (and ``algo.process_reward: prm:FOLDER``), before each GRPO step
that follows a multiple of K (steps K+1, 2K+1, …), :class:`PRMRefresh`:

1. labels the steps of the current policy's solutions to the next ``prm.refresh_problems`` training
   problems (cycling through the run's rows) with :func:`grpokit.process.labels.label_steps` through
   the run's rollout engine and sampling (``prm.samples_per_problem``, ``prm.rollouts_per_step``,
   ``prm.judge``, ``prm.threshold``), appending them to ``OUTPUT_DIR/prm_labels.jsonl``; round ``r``
   labels problems ``r·P … r·P + P - 1`` of the file (P = ``refresh_problems``), seeded by ``prm.seed``;
2. draws ``round(f / (1 - f) · n)`` earlier records (f = ``prm.replay_fraction``, n the new records
   with steps; at most all of them) so they are a share f of the rows, with ``random.Random`` seeded
   by ``prm.seed`` and the round;
3. trains the PRM in place, one pass over those rows in a seeded order, ``prm.batch_size`` rows per
   AdamW step at ``prm.learning_rate`` (constant, no weight decay, gradient norm clipped at 1), the
   loss :func:`grpokit.process.prm_train.prm_loss` on ``prm.label`` targets; its optimizer lives on
   across refreshes;
4. with ``prm.sync_reference`` copies the policy's weights into the reference model.

Everything it changes is checkpointed (:meth:`PRMRefresh.state_dict`: the PRM's weights and
optimizer, the reference weights, the round, the number of label lines): a resumed run cuts the label
file back to the checkpoint's lines and repeats what followed exactly.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpokit.config import Recipe

if TYPE_CHECKING:
    from grpokit.rollout.engine import RolloutEngine, SamplingParams

__all__ = ["LABELS_FILE", "PRMRefresh", "build_prm_refresh"]

LABELS_FILE = "prm_labels.jsonl"


def build_prm_refresh(recipe: Recipe, rewards: Any, out: Path, *, parallel: bool) -> PRMRefresh | None:
    """The run's :class:`PRMRefresh`, or None with ``prm.refresh_steps = 0``.

    Raises:
        ValueError (names ``prm.refresh_steps``): process supervision off, ``algo.process_reward`` not
            ``prm:FOLDER``, a multi-turn rollout, several ranks, or LoRA with ``prm.sync_reference``;
            an unknown ``prm.judge``.
    """
    p = recipe.prm
    if p.refresh_steps == 0:
        return None
    why = None
    if recipe.algo.supervision != "process" or not recipe.algo.process_reward.startswith("prm:"):
        why = "needs algo.supervision=process with algo.process_reward=prm:FOLDER (the PRM it retrains)"
    elif recipe.rollout.env is not None:
        why = "step labels sample single completions; rollout.env must be null"
    elif parallel:
        why = "runs on one process only (not under torchrun)"
    elif recipe.model.lora is not None and p.sync_reference:
        why = "with model.lora the reference is the policy without its adapters; set prm.sync_reference=false"
    if why:
        raise ValueError(f"prm.refresh_steps={p.refresh_steps}: iterative RL {why}")
    from grpokit.rewards.base import get_reward_function

    try:
        judge = get_reward_function(p.judge)
    except ValueError as e:
        raise ValueError(f"prm.judge: {e}") from e
    guard = rewards.step_scorer.reward
    return PRMRefresh(recipe, getattr(guard, "fn", guard), judge, out / LABELS_FILE)


class PRMRefresh:
    """The iterative-RL refresh of a run (module docstring).

    Args:
        recipe: the run's recipe (its ``prm``, ``algo`` sections).
        prm: the run's :class:`~grpokit.process.prm.TokenProbPRM` (its model is trained in place).
        judge: the outcome reward that labels steps.
        labels_path: the JSON-lines file of the run's labels.
    """

    def __init__(self, recipe: Recipe, prm: Any, judge: Any, labels_path: Path):
        p = recipe.prm
        self.recipe, self.prm, self.judge, self.labels_path = recipe, prm, judge, labels_path
        self.every, self.round, self.lines = p.refresh_steps, 0, 0
        self.optimizer = torch.optim.AdamW(prm.model.parameters(), lr=p.learning_rate, weight_decay=0.0)

    def due(self, steps_done: int) -> bool:
        """Whether a refresh comes before the step after ``steps_done``."""
        return steps_done > 0 and steps_done % self.every == 0

    def refresh(
        self,
        model: torch.nn.Module,
        ref_model: torch.nn.Module | None,
        engine: RolloutEngine,
        sampling: SamplingParams,
        rows: list[dict],
        prompts: list[str],
        *,
        step: int,
    ) -> dict[str, Any]:
        """One round (module docstring, 1-4) with the run's policy ``model`` (π_ref ``ref_model``
        re-set from it with ``prm.sync_reference``), its ``engine`` and ``sampling``, on the training
        ``rows`` and their ``prompts``, after ``step`` steps; returns its metrics: ``prm_round``,
        ``prm_labels`` (solutions labelled), ``prm_label_good_frac`` (of their steps),
        ``prm_label_tokens`` (completion tokens the labelling generated), ``prm_replay``,
        ``prm_loss`` (mean over the round's optimizer steps), ``prm_refresh_s``."""
        from grpokit.process.labels import TokenCount, append_labels, label_steps, read_labels

        p, start = self.recipe.prm, time.perf_counter()
        first = self.round * p.refresh_problems
        pick = [(first + i) % len(rows) for i in range(p.refresh_problems)]
        was_training = model.training
        model.eval()
        counted = TokenCount(engine)
        new = label_steps(
            counted,
            [prompts[i] for i in pick],
            [rows[i] for i in pick],
            judge=self.judge,
            samples_per_problem=p.samples_per_problem,
            rollouts_per_step=p.rollouts_per_step,
            sampling=sampling,
            seed=p.seed,
            step_rule=self.recipe.algo.step_rule,
            threshold=p.threshold,
            first_problem=first,
            policy=f"step {step}",
        )
        model.train(was_training)
        earlier = read_labels(self.labels_path).records  # none before the first round
        self.lines += append_labels(self.labels_path, new)
        fresh = [r for r in new if r.steps]
        rng = random.Random(f"{p.seed}:{self.round}")
        pool = [r for r in earlier if r.steps]
        replay = rng.sample(pool, min(len(pool), round(p.replay_fraction / (1 - p.replay_fraction) * len(fresh))))
        losses = self._train(fresh + replay, rng)
        if p.sync_reference and ref_model is not None:
            ref_model.load_state_dict(model.state_dict())
        self.round += 1
        good = [h for r in fresh for h in r.hard]
        return {
            "prm_round": self.round,
            "prm_labels": len(new),
            "prm_label_good_frac": sum(good) / len(good) if good else None,
            "prm_label_tokens": counted.tokens,
            "prm_replay": len(replay),
            "prm_loss": sum(losses) / len(losses) if losses else None,
            "prm_refresh_s": time.perf_counter() - start,
        }

    def _train(self, records: list[Any], rng: random.Random) -> list[float]:
        """One pass of AdamW steps over ``records`` in an order drawn from ``rng``; the losses."""
        from grpokit.process.prm_train import prm_collate, prm_examples, prm_loss

        p, model = self.recipe.prm, self.prm.model
        examples, _ = prm_examples(records, self.prm.layout, p.label, p.max_length)
        rng.shuffle(examples)
        tok = self.prm.layout.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        device = next(model.parameters()).device
        losses = []
        model.train()
        model.requires_grad_(True)
        for i in range(0, len(examples), p.batch_size):
            batch = {k: v.to(device) for k, v in prm_collate(examples[i : i + p.batch_size], pad).items()}
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            loss = prm_loss(out.logits, batch["tag_positions"], batch["targets"], self.prm.candidate_ids)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        model.eval()
        return losses

    def state_dict(self, ref_model: torch.nn.Module | None) -> dict[str, Any]:
        """What a checkpoint keeps: the round, the label lines written, the PRM's weights and
        optimizer, and (after a refresh that set it) the reference model's weights."""
        synced = self.round > 0 and self.recipe.prm.sync_reference and ref_model is not None
        return {
            "round": self.round,
            "lines": self.lines,
            "prm": self.prm.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "ref": ref_model.state_dict() if synced and ref_model is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any], ref_model: torch.nn.Module | None) -> None:
        """Back to a checkpoint's state; label lines written after it are cut off the file. An empty
        ``state`` (a checkpoint written without iterative RL: ``prm.refresh_steps`` turned on at the
        resume) starts at round 0 with the PRM of ``algo.process_reward`` and an empty label file.

        Raises:
            ValueError: the label file holds fewer lines than the checkpoint counted.
        """
        if state:
            self.prm.model.load_state_dict(state["prm"])
            self.optimizer.load_state_dict(state["optimizer"])
            if state.get("ref") is not None and ref_model is not None:
                ref_model.load_state_dict(state["ref"])
        self.round, self.lines = state.get("round", 0), state.get("lines", 0)
        _keep_lines(self.labels_path, self.lines)


def _keep_lines(path: Path, n: int) -> None:
    """Cut ``path`` after its ``n``-th line (ValueError if it has fewer; nothing to do for 0 and no file)."""
    if n == 0 and not path.exists():
        return
    data = path.read_bytes() if path.exists() else b""
    cut = 0
    for _ in range(n):
        end = data.find(b"\n", cut)
        if end < 0:
            raise ValueError(f"{path}: fewer than {n} label lines, the number the checkpoint counted")
        cut = end + 1
    if cut != len(data):
        with open(path, "r+b") as f:
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())
