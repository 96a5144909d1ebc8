"""Everything a run needs, built from a recipe: rows, prompts, reward functions, models, optimizer.

Bad input fails here, before the (slow) model load: data, rewards and recipe values come first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from grpokit.config import Recipe


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_data_rows(recipe: Recipe, *, dataset: str, split: str, limit: int | None) -> list[dict]:
    """Rows of ``dataset``/``split`` (validated: known dataset and split, prompt/answer columns,
    non-empty prompts); needs no tokenizer, so bad data fails before anything slow loads."""
    from grpokit.data import load_rows

    d = recipe.data
    return load_rows(dataset, split, limit=limit, seed=recipe.train.seed, options=dict(d.options),
                     prompt_field=d.prompt_field, answer_field=d.answer_field)


def _section_rows(recipe: Recipe, section: str) -> list[dict]:
    """``load_data_rows`` for the ``data`` or ``eval`` section; errors say which keys they concern."""
    sec = getattr(recipe, section)
    skip = recipe.data.skip if section == "data" else 0
    try:
        limit = None if sec.limit is None else skip + sec.limit
        rows = load_data_rows(recipe, dataset=sec.dataset, split=sec.split, limit=limit)[skip:]
        if not rows:
            raise ValueError(f"no rows left after data.skip={skip}")
        return rows
    except (ValueError, FileNotFoundError) as e:
        raise type(e)(f"{section}.dataset={sec.dataset!r} {section}.split={sec.split!r}: {e}") from e


def load_prompts(recipe: Recipe, tokenizer, *, dataset: str, split: str, limit: int | None,
                 rows: list[dict] | None = None):
    """Rows of ``dataset``/``split`` (or the given ``rows``) and their chat prompts; over-long
    prompts dropped (counted)."""
    from grpokit.data import build_chat_prompt, filter_by_prompt_length

    d = recipe.data
    if rows is None:
        rows = load_data_rows(recipe, dataset=dataset, split=split, limit=limit)
    prompts = [build_chat_prompt(tokenizer, r["prompt"], system_prompt=d.system_prompt,
                                 template=d.prompt_template) for r in rows]
    keep, skipped = filter_by_prompt_length(prompts, tokenizer, d.max_prompt_tokens)
    if not keep:
        raise ValueError(f"data: all {len(rows)} prompts of {dataset}/{split} are longer than "
                         f"data.max_prompt_tokens={d.max_prompt_tokens}")
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
        funcs[name] = GuardedReward(name, fn, timeout_s=rc.timeout_s, on_error=rc.on_error)
    weights = dict(zip(rc.functions, rc.weights)) if rc.weights else {n: 1.0 for n in rc.functions}
    return funcs, weights


class Setup:
    """The run's parts; the trainer calls its methods."""

    def __init__(self, recipe: Recipe):
        from grpokit.models import eos_token_ids, load_model, load_tokenizer
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
        self.eval_rows = _section_rows(recipe, "eval") if e.dataset else None
        # 2. tokenizer, prompts; 3. models
        self.tokenizer = load_tokenizer(m.name_or_path, trust_remote_code=m.trust_remote_code)
        self.rows, self.prompts, self.skipped_prompts = load_prompts(
            recipe, self.tokenizer, dataset=d.dataset, split=d.split, limit=d.limit, rows=rows)
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

    def run_eval(self, when: str) -> dict[str, Any]:
        from grpokit.evaluate import evaluate

        e = self.recipe.eval
        rows, prompts, _ = load_prompts(self.recipe, self.tokenizer, dataset=e.dataset, split=e.split,
                                        limit=e.limit, rows=self.eval_rows)
        res = evaluate(self.model, self.tokenizer, prompts, rows, eos_token_ids=self.eos_ids,
                       max_new_tokens=e.max_new_tokens or self.recipe.rollout.max_new_tokens,
                       batch_size=e.batch_size)
        res.update(dataset=e.dataset, split=e.split, when=when)
        (self.out / f"eval_{when}.json").write_text(json.dumps(res, indent=1))
        print(f"[grpokit] eval {when}: {e.dataset}/{e.split} accuracy {res['accuracy']:.3f} "
              f"({res['correct']}/{res['total']}, greedy)", flush=True)
        return res

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
            state.update(load_file(f))
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
