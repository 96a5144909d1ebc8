"""``grpokit prm label`` and ``grpokit prm train`` (:mod:`grpokit.cli.prm`): a recipe's ``prm``
section (:class:`grpokit.config.PrmConfig`) turned into automatic step labels of its policy
(:func:`grpokit.process.labels.label_steps`) and a PRM trained on them
(:func:`grpokit.process.prm_train.train_prm`). Every check that needs no model runs before a model
loads; errors name the recipe key at fault.
"""

from __future__ import annotations

import time
from typing import Any

from grpokit.config import Recipe
from grpokit.utils.outputs import check_output_dir

__all__ = ["main_prm_label", "main_prm_train", "policy_engine", "policy_problems", "problem_runs"]


def problem_runs(todo: list[int], size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: ``todo`` (sorted problem indices) cut into runs of consecutive
    indices, each at most ``size`` long.

    >>> problem_runs([0, 1, 2, 5, 6, 9], 2)
    [(0, 2), (2, 3), (5, 7), (9, 10)]
    """
    runs: list[tuple[int, int]] = []
    for b in todo:
        if runs and runs[-1][1] == b and b - runs[-1][0] < size:
            runs[-1] = (runs[-1][0], b + 1)
        else:
            runs.append((b, b + 1))
    return runs


def _settings(recipe: Recipe) -> dict[str, Any]:
    """The labelling settings a record's provenance fields hold (:class:`grpokit.process.labels.StepLabels`)."""
    p = recipe.prm
    return {
        "policy": recipe.model.name_or_path,
        "samples_per_problem": p.samples_per_problem,
        "rollouts_per_step": p.rollouts_per_step,
        "seed": p.seed,
        "step_rule": recipe.algo.step_rule,
        "threshold": p.threshold,
    }


def policy_problems(recipe: Recipe) -> tuple[list[dict], list[str], int, Any]:
    """``(rows, prompts, heldout_dropped, tokenizer)``: the recipe's training rows whose question is not
    one of the ``eval`` section's held-out problems (compared without case and spaces), their prompts
    as training renders them (with the model's tokenizer, returned too), and how many rows were held-out
    problems. What the policy is asked when its own solutions are labelled or probed.

    Raises:
        ValueError: every training problem is a held-out one; bad data (names the key).
    """
    from grpokit.data.rows import section_rows, training_prompts
    from grpokit.models.loading import load_tokenizer, model_max_positions
    from grpokit.trainer.sft import drop_heldout_questions

    m = recipe.model
    rows = section_rows(recipe, "data")
    heldout_dropped = 0
    if recipe.eval.dataset:  # the held-out problems are never labelled
        rows, heldout_dropped = drop_heldout_questions(rows, section_rows(recipe, "eval"))
        if not rows:
            raise ValueError("data: every training problem is one of the held-out (eval) problems")
    tokenizer = load_tokenizer(m.name_or_path, trust_remote_code=m.trust_remote_code)
    max_positions = model_max_positions(m.name_or_path, trust_remote_code=m.trust_remote_code)
    rows, prompts, _ = training_prompts(recipe, tokenizer, rows, max_positions)
    return rows, prompts, heldout_dropped, tokenizer


def policy_engine(recipe: Recipe, tokenizer: Any, device: Any) -> Any:
    """The recipe's model (``model.name_or_path`` on ``device``, in eval mode) behind its rollout
    engine (``rollout.engine``)."""
    from grpokit.models.loading import eos_token_ids, load_model
    from grpokit.rollout.engine import load_engine

    m = recipe.model
    model = load_model(m.name_or_path, device=device, trust_remote_code=m.trust_remote_code).eval()
    eos = eos_token_ids(model, tokenizer)
    return load_engine(recipe.rollout.engine, model=model, tokenizer=tokenizer, eos_token_ids=eos)


def main_prm_label(recipe: Recipe) -> dict[str, Any]:
    """Label the steps of ``recipe.model``'s own solutions to its first ``prm.problems`` training
    problems (the ``data`` rows whose question is not one of the ``eval`` section's held-out problems,
    compared without case and spaces) and append the records to ``prm.labels``; problems already
    complete there are skipped (a cut-off run resumes).

    Returns:
        ``labels`` (the file), ``problems`` (in scope), ``labelled`` (this call), ``skipped``
        (complete before), ``heldout_left_out`` (training rows that are held-out problems),
        ``records``/``steps``/``good_frac`` of this call's records, ``tokens`` (completion tokens it
        generated: solutions and step rollouts), ``seconds``.

    Raises:
        ValueError: ``prm.labels`` not set; an unknown ``prm.judge``; the file holds records made with
            other settings (named); bad data or step rule (names the key); a multi-turn recipe.
        OSError: the file cannot be written.
    """
    from grpokit.process.labels import TokenCount, append_labels, label_steps, read_labels
    from grpokit.process.steps import split_steps
    from grpokit.rewards.base import get_reward_function
    from grpokit.rollout.engine import SamplingParams
    from grpokit.trainer.build import resolve_device

    p, m, r = recipe.prm, recipe.model, recipe.rollout
    if p.labels is None:
        raise ValueError("prm.labels: not set; the JSON-lines file the step labels are written to")
    if r.env is not None:
        raise ValueError("rollout.env: step labels sample single completions; set rollout.env=null")
    try:
        judge = get_reward_function(p.judge)
    except ValueError as e:
        raise ValueError(f"prm.judge: {e}") from e
    try:
        split_steps("a\nb", recipe.algo.step_rule)
    except ValueError as e:
        raise ValueError(f"algo.step_rule: {e}") from None
    done = read_labels(p.labels)
    want = _settings(recipe)  # the provenance each record carries
    for rec in done.records:
        got = {k: getattr(rec, k) for k in want}
        if got != want:
            diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
            raise ValueError(
                f"prm.labels: {p.labels} holds records labelled with other settings (file, recipe): {diff}; "
                "use another file or the same settings"
            )
    sampling = SamplingParams.from_config(r)
    rows, prompts, heldout_dropped, tokenizer = policy_problems(recipe)
    device = resolve_device(m.device)
    n = len(rows) if p.problems is None else min(p.problems, len(rows))
    todo = [b for b in range(n) if b not in done.complete]
    start = time.time()
    new: list[Any] = []
    engine = None
    if todo:
        engine = TokenCount(policy_engine(recipe, tokenizer, device))
        for lo, hi in problem_runs(todo, p.problems_per_call):
            records = label_steps(
                engine,
                prompts[lo:hi],
                rows[lo:hi],
                judge=judge,
                samples_per_problem=p.samples_per_problem,
                rollouts_per_step=p.rollouts_per_step,
                sampling=sampling,
                seed=p.seed,
                step_rule=recipe.algo.step_rule,
                threshold=p.threshold,
                first_problem=lo,
                policy=m.name_or_path,
            )
            append_labels(p.labels, records)
            new += records
            print(
                f"[grpokit] prm label: problems {lo}..{hi - 1} of {n} -> {p.labels} ({time.time() - start:.0f} s)",
                flush=True,
            )
    flat = [h for rec in new for h in rec.hard]
    return {
        "labels": p.labels,
        "problems": n,
        "labelled": len(todo),
        "skipped": n - len(todo),
        "heldout_left_out": heldout_dropped,
        "records": len(new),
        "steps": len(flat),
        "good_frac": sum(flat) / len(flat) if flat else None,
        "tokens": 0 if engine is None else engine.tokens,
        "seconds": round(time.time() - start, 1),
    }


def main_prm_train(recipe: Recipe) -> dict[str, Any]:
    """Train ``prm.model`` (default ``model.name_or_path``) into a PRM on the records of
    ``prm.labels`` and write it to ``prm.output_dir`` (:func:`grpokit.process.prm_train.train_prm`).

    Returns:
        The record written to ``prm.output_dir/prm_info.json``.

    Raises:
        ValueError: ``prm.labels``/``prm.output_dir`` not set; no records in the file; the step tag or
            candidate tokens not in the tokenizer (named ``prm.step_tag``/``prm.good_token``/``prm.bad_token``).
        OSError: ``prm.output_dir`` is a file or a folder that is not empty, or cannot be written;
            ``prm.labels`` cannot be read.
    """
    from grpokit.models.loading import load_model, load_tokenizer
    from grpokit.process.labels import read_labels
    from grpokit.process.prm_train import PRMSpec, train_prm
    from grpokit.trainer.build import resolve_device

    p, m = recipe.prm, recipe.model
    for key in ("labels", "output_dir"):
        if getattr(p, key) is None:
            raise ValueError(f"prm.{key}: not set")
    assert p.labels is not None and p.output_dir is not None
    out = check_output_dir(p.output_dir, "prm.output_dir", empty=True)
    labels = read_labels(p.labels)
    if not labels.records:
        raise ValueError(f"prm.labels: {p.labels} holds no records; run `grpokit prm label` first")
    name = p.model or m.name_or_path
    tokenizer = load_tokenizer(name, trust_remote_code=m.trust_remote_code)
    spec = PRMSpec(step_tag=p.step_tag, good_token=p.good_token, bad_token=p.bad_token)
    try:
        spec.layout(tokenizer)
        spec.candidate_ids(tokenizer)
    except ValueError as e:
        raise ValueError(f"prm.{e}") from None  # the message starts with the key's name
    model = load_model(name, device=resolve_device(m.device), trust_remote_code=m.trust_remote_code)
    return train_prm(
        model,
        tokenizer,
        labels.records,
        out,
        spec=spec,
        label=p.label,
        eval_fraction=p.eval_fraction,
        epochs=p.epochs,
        max_steps=p.max_steps,
        learning_rate=p.learning_rate,
        batch_size=p.batch_size,
        warmup_steps=p.warmup_steps,
        seed=p.seed,
        max_length=p.max_length,
        info={"model": name, "labels": p.labels, "labelled_with": _settings(recipe)},
    )
