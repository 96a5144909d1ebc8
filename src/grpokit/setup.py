"""Everything a run needs, built from a recipe: rows, prompts, reward functions, models, optimizer.

Bad input fails here, before the (slow) model load: data, rewards and recipe values come first.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

from grpokit.config import Recipe


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_data_rows(recipe: Recipe, *, dataset: str, split: str, limit: int | None, seed: int | None = None,
                   options: dict | None = None, shuffle_seed: int | None = None) -> list[dict]:
    """Rows of ``dataset``/``split`` (validated: known dataset and split, prompt/answer columns,
    non-empty prompts); needs no tokenizer, so bad data fails before anything slow loads.
    ``seed``/``options`` default to ``train.seed``/``data.options``. With ``shuffle_seed`` every
    row is read and put in :func:`shuffled_rows` order before the first ``limit`` are kept."""
    from grpokit.data import load_rows

    d = recipe.data
    rows = load_rows(dataset, split, limit=limit if shuffle_seed is None else None,
                     seed=recipe.train.seed if seed is None else seed,
                     options=dict(d.options if options is None else options),
                     prompt_field=d.prompt_field, answer_field=d.answer_field)
    return shuffled_rows(rows, shuffle_seed)[:limit]


def shuffled_rows(rows: list[dict], seed: int | None) -> list[dict]:
    """``rows`` in the order of ``random.Random(seed).shuffle`` (a copy), or as they are for ``seed=None``.

    >>> [r["i"] for r in shuffled_rows([{"i": i} for i in range(5)], 0)]
    [2, 1, 0, 4, 3]
    """
    if seed is None:
        return rows
    out = list(rows)
    random.Random(seed).shuffle(out)
    return out


def _section_rows(recipe: Recipe, section: str) -> list[dict]:
    """``load_data_rows`` for the ``data`` or ``eval`` section; errors say which keys they concern."""
    from grpokit import heldout

    sec = getattr(recipe, section)
    skip = recipe.data.skip if section == "data" else 0
    held = section == "eval"
    try:
        limit = None if sec.limit is None else skip + sec.limit
        rows = load_data_rows(recipe, dataset=sec.dataset, split=sec.split, limit=limit,
                              seed=heldout.eval_seed(recipe) if held else None,
                              options=heldout.eval_options(recipe) if held else None,
                              shuffle_seed=heldout.shuffle_seed(recipe, section))[skip:]
        if not rows:
            raise ValueError(f"no rows left after data.skip={skip}")
        return rows
    except (ValueError, FileNotFoundError) as e:
        # a fixed, one-argument class: ``type(e)(msg)`` fails for UnicodeDecodeError (5 arguments)
        cls = FileNotFoundError if isinstance(e, FileNotFoundError) else ValueError
        raise cls(f"{section}.dataset={sec.dataset!r} {section}.split={sec.split!r}: {e}") from e


def load_prompts(recipe: Recipe, tokenizer, *, dataset: str, split: str, limit: int | None,
                 rows: list[dict] | None = None, max_new_tokens: int | None = None,
                 max_positions: int | None = None, new_tokens_key: str = "rollout.max_new_tokens",
                 section: str = "data"):
    """Rows of ``dataset``/``split`` (or the given ``rows``) and their chat prompts; prompts longer
    than ``data.max_prompt_tokens``, or whose tokens plus ``max_new_tokens`` exceed the model's
    ``max_positions``, are dropped and counted.

    Raises:
        ValueError: ``max_new_tokens >= max_positions`` (no room for any prompt), or no prompt
            left; the message names ``new_tokens_key``, both numbers and the dataset.
    """
    from grpokit.data import build_chat_prompt, filter_by_prompt_length

    d = recipe.data
    if rows is None:
        rows = load_data_rows(recipe, dataset=dataset, split=split, limit=limit)
    prompts = [build_chat_prompt(tokenizer, r["prompt"], system_prompt=d.system_prompt,
                                 template=d.prompt_template) for r in rows]
    keep, skipped = filter_by_prompt_length(prompts, tokenizer, d.max_prompt_tokens)
    if not keep:
        raise ValueError(f"{section}: all {len(rows)} prompts of {dataset}/{split} are longer than "
                         f"data.max_prompt_tokens={d.max_prompt_tokens}")
    if max_positions is not None and max_new_tokens is not None:
        room = max_positions - max_new_tokens  # longest prompt that leaves room for a whole completion
        context = f"{new_tokens_key}={max_new_tokens} and the model's {max_positions} positions"
        if room < 1:
            raise ValueError(f"{new_tokens_key}={max_new_tokens} leaves no room for a prompt: the model "
                             f"has {max_positions} positions (prompt tokens + new tokens must fit)")
        fits, over = filter_by_prompt_length([prompts[i] for i in keep], tokenizer, room)
        if not fits:
            raise ValueError(f"{section}: all {len(keep)} prompts of {dataset}/{split} are longer than {room} "
                             f"tokens, the most that fits with {context}")
        if over:
            print(f"[grpokit] note: {over} prompts of {dataset}/{split} skipped: longer than {room} tokens, "
                  f"the most that fits with {context}", file=sys.stderr, flush=True)
        keep, skipped = [keep[i] for i in fits], skipped + over
    return [rows[i] for i in keep], [prompts[i] for i in keep], skipped


def resolve_rewards(recipe: Recipe) -> tuple[dict, dict]:
    """Reward functions (wrapped with the timeout/fault policy) and their weights."""
    from grpokit.rewards import get_reward_function
    from grpokit.rewards.guard import GuardedReward

    rc = recipe.rewards
    funcs = {}
    for name in rc.functions:
        try:
            fn = get_reward_function(name)
        except ValueError as e:
            raise ValueError(f"rewards.functions: {e}") from e
        funcs[name] = GuardedReward(name, fn, timeout_s=rc.timeout_s, on_error=rc.on_error,
                                    isolation=rc.isolation)
    weights = dict(zip(rc.functions, rc.weights)) if rc.weights else {n: 1.0 for n in rc.functions}
    return funcs, weights


class Setup:
    """The run's parts; the trainer calls its methods."""

    def __init__(self, recipe: Recipe):
        from grpokit.models import eos_token_ids, load_model, load_tokenizer, model_max_positions
        from grpokit.trainer import TrainState, make_optimizer, seed_everything

        self.recipe = recipe
        m = recipe.model
        seed_everything(recipe.train.seed)
        # 1. what can be checked without the tokenizer or the model: rewards, step rule, data
        self.reward_funcs, self.reward_weights = resolve_rewards(recipe)
        if recipe.algo.supervision == "process":
            from grpokit.process import resolve_process_reward
            from grpokit.rewards.steps import split_steps

            self.process_reward = resolve_process_reward(recipe)
            try:
                split_steps("a\nb", recipe.algo.step_rule)
            except ValueError as e:
                raise ValueError(f"algo.step_rule: {e}") from None
        d, e = recipe.data, recipe.eval
        rows = _section_rows(recipe, "data")
        self.eval_rows = self._held_out_rows(rows) if e.dataset else None
        # 2. tokenizer, prompts; 3. models
        self.tokenizer = load_tokenizer(m.name_or_path, trust_remote_code=m.trust_remote_code)
        self.max_positions = model_max_positions(m.name_or_path, trust_remote_code=m.trust_remote_code)
        self.rows, self.prompts, self.skipped_prompts = load_prompts(
            recipe, self.tokenizer, dataset=d.dataset, split=d.split, limit=d.limit, rows=rows,
            max_new_tokens=recipe.rollout.max_new_tokens, max_positions=self.max_positions)
        self.eval_prompts = self._eval_prompts() if e.dataset else None  # must fit too: fail now
        if len(self.rows) < recipe.train.prompts_per_step:
            print(f"[grpokit] note: {len(self.rows)} prompts < train.prompts_per_step; prompts repeat "
                  "within a step", file=sys.stderr)
        self.row_columns = sorted({k for r in self.rows for k in r} - {"prompt"})
        self.model = load_model(m.name_or_path, dtype=_dtype(m.dtype), trust_remote_code=m.trust_remote_code)
        self.model.eval()  # no dropout: sampler and trainer see the same π
        if m.fused_ops:
            from grpokit.fused import apply_fused_ops

            apply_fused_ops(self.model, recompute_mlp=m.recompute_mlp)
        if m.gradient_checkpointing:
            from grpokit.policy import enable_gradient_checkpointing

            enable_gradient_checkpointing(self.model)
        self.ref_model = None
        if recipe.algo.beta > 0:
            self.ref_model = load_model(m.name_or_path, dtype=_dtype(m.dtype), trust_remote_code=m.trust_remote_code)
            self.ref_model.eval().requires_grad_(False)
            if m.fused_ops:
                apply_fused_ops(self.ref_model)
        self.eos_ids = eos_token_ids(self.model, self.tokenizer)
        self.optimizer, self.scheduler = make_optimizer(self.model, recipe)
        self.state = TrainState()
        self.out = Path(recipe.train.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        print(f"[grpokit] {len(self.rows)} prompts ({self.skipped_prompts} skipped as too long) from "
              f"{recipe.data.dataset}/{recipe.data.split}; model {m.name_or_path}; "
              f"β={recipe.algo.beta}; G={recipe.rollout.group_size}", flush=True)

    # -- step pieces -------------------------------------------------------------------------
    def generate(self, prompts: list[str], *, seed: int):
        from grpokit.rollout.hf import SamplingParams, generate_rollouts

        r = self.recipe.rollout
        params = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, min_p=r.min_p,
                                max_new_tokens=r.max_new_tokens, sampler=r.sampler)
        # with bf16 autocast the trainer scores in bf16, so sampling from a bf16 copy matches it
        sampler_dtype = torch.bfloat16 if self.recipe.model.autocast_bf16 else None
        return generate_rollouts(self.model, self.tokenizer, prompts, r.group_size, params,
                                 eos_token_ids=self.eos_ids, chunk_size=r.chunk_size, seed=seed,
                                 sampler_dtype=sampler_dtype)

    def compute_rewards(self, prompts, completions, columns):
        from grpokit.rewards import compute_rewards

        return compute_rewards(self.reward_funcs, self.reward_weights, prompts, completions, columns)

    def _held_out_rows(self, train_rows: list[dict]) -> list[dict]:
        """The eval section's rows, checked apart from the training rows (:mod:`grpokit.heldout`)."""
        from grpokit import heldout
        from grpokit.rewards import get_reward_function

        heldout.check_ranges(self.recipe)
        self.eval_scorer = self.recipe.eval.scorer or heldout.default_scorer(self.recipe.eval.dataset)
        try:
            get_reward_function(self.eval_scorer)  # a bad name fails before any model loads
        except ValueError as err:
            raise ValueError(f"eval.scorer: {err}") from None
        rows, dropped = heldout.drop_training_questions(train_rows, _section_rows(self.recipe, "eval"))
        e = self.recipe.eval
        if not rows:
            raise ValueError(f"eval: every held-out problem of {e.dataset}/{e.split} is also a training question")
        self.eval_note = (f"{len(rows)} held-out problems, none a training question ({dropped} left out as "
                          f"training questions; data seed {heldout.eval_seed(self.recipe)})")
        return rows

    def run_eval(self, when: str) -> dict[str, Any]:
        from grpokit.evaluate import evaluate
        from grpokit.evalstats import format_summary
        from grpokit.heldout import answer_extractor
        from grpokit.rewards import get_reward_function

        e = self.recipe.eval
        rows, prompts = self.eval_prompts
        scorer = self.eval_scorer
        res = evaluate(self.model, self.tokenizer, prompts, rows, eos_token_ids=self.eos_ids,
                       max_new_tokens=self._eval_new_tokens(), scorer=get_reward_function(scorer),
                       batch_size=e.batch_size, scorer_timeout_s=self.recipe.rewards.timeout_s,
                       isolation=self.recipe.rewards.isolation, num_samples=e.num_samples,
                       temperature=self.recipe.rollout.temperature, seed=self.recipe.train.seed,
                       extract_answer=answer_extractor(scorer))
        res.update(dataset=e.dataset, split=e.split, when=when, scorer=scorer, held_out=self.eval_note)
        self.save_eval(res, when)
        print(f"[grpokit] eval {when}: {e.dataset}/{e.split} accuracy {res['accuracy']:.3f} "
              f"({res['correct']}/{res['total']}, greedy; {self.eval_note}; scorer {scorer})\n"
              f"{format_summary(res['metrics'])}", flush=True)
        self._warn_eval(res, when)
        return res

    def save_eval(self, res: dict[str, Any], when: str) -> dict[str, Any]:
        """Write ``eval_<when>.json``; returns ``res``."""
        (self.out / f"eval_{when}.json").write_text(json.dumps(res, indent=1))
        return res

    def _warn_eval(self, res: dict[str, Any], when: str) -> None:
        """An evaluation that measured little (most answers cut, rows the scorer could not score)
        says so, as a training step does (``grpokit.metrics.RunWarning``)."""
        import warnings

        from grpokit.metrics import TRUNCATED_WARN_FRAC, RunWarning

        if res["truncated_frac"] >= TRUNCATED_WARN_FRAC:
            key = "eval.max_new_tokens" if self.recipe.eval.max_new_tokens else "rollout.max_new_tokens"
            warnings.warn(f"eval {when}: {res['truncated_frac']:.0%} of the greedy completions reached "
                          f"{key}={self._eval_new_tokens()} without an EOS: their answers count as wrong",
                          RunWarning, stacklevel=3)
        if res.get("unscorable"):
            warnings.warn(f"eval {when}: the scorer gave no score (raised, timed out, or could not read the "
                          f"reference) for {res['unscorable']} completions (counted as wrong)", RunWarning,
                          stacklevel=3)

    def _eval_new_tokens(self) -> int:
        return self.recipe.eval.max_new_tokens or self.recipe.rollout.max_new_tokens

    def _eval_prompts(self) -> tuple[list[dict], list[str]]:
        e = self.recipe.eval
        key = "eval.max_new_tokens" if e.max_new_tokens else "rollout.max_new_tokens (eval.max_new_tokens unset)"
        rows, prompts, _ = load_prompts(self.recipe, self.tokenizer, dataset=e.dataset, split=e.split,
                                        limit=e.limit, rows=self.eval_rows, max_new_tokens=self._eval_new_tokens(),
                                        max_positions=self.max_positions, new_tokens_key=key, section="eval")
        return rows, prompts

    def checkpoint(self, logger) -> Path:
        from grpokit.checkpoint import save_checkpoint

        st = self.state
        return save_checkpoint(
            self.out, st.step, model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer,
            scheduler=self.scheduler,
            trainer_state={"epoch": st.epoch, "position": st.position,
                           "consecutive_skips": st.consecutive_skips, "extra": st.extra},
            recipe=self.recipe.to_dict(), keep=self.recipe.train.save_total_limit,
        )

    def load_weights(self, ckpt: Path) -> None:
        from safetensors.torch import load_file

        files = sorted(ckpt.glob("*.safetensors"))
        state = {}
        for f in files:
            try:
                state.update(load_file(f))
            except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
                raise ValueError(f"checkpoint {ckpt}: {f.name} cannot be read ({type(e).__name__}: {e}); "
                                 "resume from another checkpoint (train.resume=<folder>) or start over "
                                 "(train.resume=none)") from e
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied embeddings
        if real_missing or unexpected:
            raise ValueError(f"checkpoint {ckpt}: missing {real_missing[:5]}, unexpected {unexpected[:5]}")

    def progress_bar(self, enabled: bool):
        from tqdm.auto import tqdm

        return tqdm(total=self.recipe.train.max_steps, initial=self.state.step, disable=not enabled,
                    desc="grpo", unit="step", dynamic_ncols=True)

    def write_summary(self, summary: dict) -> None:
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


def prepare(recipe: Recipe) -> Setup:
    return Setup(recipe)
