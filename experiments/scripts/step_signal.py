"""Where can step credit help? Outcome signal and step correctness of a policy's own samples (issue #33).

    python experiments/scripts/step_signal.py sample RECIPE [section.key=value ...] [--problems 64] [--json OUT]
    python experiments/scripts/step_signal.py labels RECIPE [section.key=value ...] [--prm FOLDER] [--json OUT]

``sample``: the recipe's model samples ``rollout.group_size`` completions of each of its first
``--problems`` training problems (held-out problems left out, prompts as training renders them, the
recipe's sampling); ``labels``: the solutions of ``prm.labels`` (``grpokit prm label``; a problem's
``prm.samples_per_problem`` solutions form its group). For each group of completions:

- outcome: ``prm.judge`` (default ``math_correct``; the recipe's ``prm`` section) per completion (in
  ``labels`` mode the label file's: a solution's last-step label is its judged outcome); a
  group has **no outcome signal** when its rewards are all equal (all right or all wrong: the group's
  advantages are 0 under outcome supervision);
- steps (``algo.step_rule``), each checked by the rule verifier's claims
  (:func:`grpokit.process.find_claims`): a step is *checked* when it makes an arithmetic claim and
  *right* when every claim holds; a completion's *prefix-right* steps are those before its first
  wrong claim;
- the rule verifier's step rewards (:func:`grpokit.process.arithmetic_step_rewards`: a wrong claim
  zeroes its step and the rest, the last step also needs the right answer): a group without outcome
  signal **has process signal** when those rewards, pooled over the group's steps, are not all equal
  (what ``algo.supervision=process`` normalizes over; a claim-free first line scored 1 before a wrong
  answer counts too), and *has a right checked step* when some step of the group makes only true claims;
- ``labels`` also: how the Monte-Carlo hard labels agree with the verifier's claim check on the
  same steps (a step is verifier-good when it and every step before it hold); with ``--prm FOLDER``
  (``grpokit prm train``'s output) the PRM scores the steps of the problems its training held out
  (``prm.eval_fraction``, ``prm.seed``: the same split) and its AUC is given against the verifier and
  against the Monte-Carlo hard labels, last steps left out (their label is the answer's outcome).

Prints one JSON object (also to ``--json``). No model is trained; ``sample`` runs the policy only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from grpokit.cli.recipe_args import command_recipe, find_recipe, split_overrides
from grpokit.process import arithmetic_step_rewards, find_claims, split_steps, step_texts
from grpokit.process.prm_metrics import auc
from grpokit.rewards.base import get_reward_function
from grpokit.rewards.calling import RewardCall


def _sample(recipe, problems: int) -> list[dict]:
    """Groups of the recipe's own samples: ``[{prompt, row, completions}]``."""
    from grpokit.rollout.engine import SamplingParams
    from grpokit.trainer.build import resolve_device
    from grpokit.trainer.prm import policy_engine, policy_problems

    r = recipe.rollout
    rows, prompts, _, tokenizer = policy_problems(recipe)  # as grpokit prm label asks them
    rows, prompts = rows[:problems], prompts[:problems]
    engine = policy_engine(recipe, tokenizer, resolve_device(recipe.model.device))
    exp = engine.generate(prompts, r.group_size, SamplingParams.from_config(r), recipe.train.seed)
    G = r.group_size
    return [
        {"prompt": prompts[b], "row": rows[b], "completions": list(exp.completions[b * G : (b + 1) * G])}
        for b in range(len(prompts))
    ]


def _from_labels(recipe) -> list[dict]:
    from grpokit.process.labels import read_labels

    by_problem: dict[int, list] = {}
    for rec in read_labels(recipe.prm.labels).records:
        by_problem.setdefault(rec.problem, []).append(rec)
    groups = []
    for _, recs in sorted(by_problem.items()):
        recs.sort(key=lambda x: x.sample)
        row = {"prompt": recs[0].question, "answer": recs[0].answer}
        groups.append(
            {"prompt": recs[0].prompt, "row": row, "completions": ["".join(x.steps) for x in recs], "labels": recs}
        )
    return groups


def _claims_ok(step: str) -> tuple[bool, bool]:
    """(checked: makes an arithmetic claim, right: every claim holds)."""
    claims = find_claims(step)
    return bool(claims), all(c.ok for c in claims)


def _first_wrong(flags: list[tuple[bool, bool]]) -> int:
    """The index of the first step whose claims do not all hold (``len(flags)`` if none), from
    :func:`_claims_ok` of each step."""
    return next((k for k, (_, right) in enumerate(flags) if not right), len(flags))


def _verifier_good(steps: list[str]) -> list[int]:
    """1 for each step before the first step with a wrong claim, else 0."""
    first_bad = _first_wrong([_claims_ok(x) for x in steps])
    return [int(k < first_bad) for k in range(len(steps))]


def prm_check(recipe, folder: str) -> dict:
    """The PRM's step scores on its own held-out problems against the verifier and the MC labels."""
    from grpokit.process.labels import read_labels
    from grpokit.process.prm_train import load_prm, split_by_problem

    records = [r for r in read_labels(recipe.prm.labels).records if len(r.steps) > 1]
    _, held = split_by_problem(records, recipe.prm.eval_fraction, recipe.prm.seed)
    prm = load_prm(folder, batch_size=16)
    scores = prm([r.prompt for r in held], ["".join(r.steps) for r in held], [r.steps for r in held])
    s_all, by_rule, by_mc = [], [], []
    for r, sc in zip(held, scores):
        for k, (v, good) in enumerate(zip(sc[:-1], _verifier_good(r.steps)[:-1])):
            if v is not None:
                s_all.append(v)
                by_rule.append(good)
                by_mc.append(r.hard[k])
    return {
        "heldout_solutions": len(held),
        "steps_scored": len(s_all),
        "auc_vs_verifier": auc(s_all, by_rule),
        "auc_vs_mc_hard_labels": auc(s_all, by_mc),
        "score_mean": statistics.fmean(s_all) if s_all else None,
    }


def measure(recipe, groups: list[dict]) -> dict:
    """The statistics of the module docstring over ``groups``."""
    judge = RewardCall(get_reward_function(recipe.prm.judge), recipe.prm.judge)
    rule = recipe.algo.step_rule
    n_groups = len(groups)
    no_signal = all_wrong = all_right = process_signal_when_none = right_claim_when_none = 0
    n_done, right, steps_n, checked, claims_right, wrong_ans, wrong_ans_first_right = 0, 0, [], 0, 0, 0, 0
    prefix_right_share = []
    agree, mc_scores, mc_labels = [0, 0], [], []
    for g in groups:
        texts = g["completions"]
        if "labels" in g:  # the last step's label is the solution's own judged outcome
            ok = [bool(rec.steps) and bool(rec.hard[-1]) for rec in g["labels"]]
        else:
            columns = {k: [v] * len(texts) for k, v in g["row"].items() if k != "prompt"}
            values = judge([g["row"].get("prompt", g["prompt"])] * len(texts), texts, **columns)
            ok = [v is not None and v >= recipe.prm.threshold for v in values]
        steps = [step_texts(t, split_steps(t, rule)) for t in texts]
        flags_all = [[_claims_ok(x) for x in s] for s in steps]  # each step's claims checked once
        process = arithmetic_step_rewards(
            [g["prompt"]] * len(texts), texts, steps, answer=[g["row"].get("answer")] * len(texts)
        )
        n_done += len(texts)
        right += sum(ok)
        if len(set(ok)) == 1:
            no_signal += 1
            all_right += ok[0]
            all_wrong += not ok[0]
            pooled = {v for row in process for v in row if v is not None}
            process_signal_when_none += len(pooled) > 1
            right_claim_when_none += any(c and r for flags in flags_all for c, r in flags)
        for i, (s, flags) in enumerate(zip(steps, flags_all)):
            steps_n.append(len(s))
            checked += sum(c for c, _ in flags)
            claims_right += sum(c and r for c, r in flags)
            first_bad = _first_wrong(flags)
            if s:
                prefix_right_share.append(first_bad / len(s))
            if not ok[i] and s:
                wrong_ans += 1
                wrong_ans_first_right += flags[0][0] and flags[0][1]
            if "labels" in g:  # MC hard labels against "this step and every one before it hold"
                rec = g["labels"][i]
                for k, h in enumerate(rec.hard[:-1]):  # the last step's label is the outcome itself
                    good = int(k < first_bad)
                    agree[0] += good == h
                    agree[1] += 1
                    mc_scores.append(rec.soft[k])
                    mc_labels.append(good)
    out = {
        "problems": n_groups,
        "completions": n_done,
        "answer_accuracy": right / max(n_done, 1),
        "groups_without_outcome_signal": no_signal / max(n_groups, 1),
        "groups_all_wrong": all_wrong / max(n_groups, 1),
        "groups_all_right": all_right / max(n_groups, 1),
        "of_those_with_process_signal": process_signal_when_none / no_signal if no_signal else None,
        "of_those_with_a_right_checked_step": right_claim_when_none / no_signal if no_signal else None,
        "steps_per_completion": statistics.fmean(steps_n) if steps_n else 0.0,
        "steps_checked_frac": checked / max(sum(steps_n), 1),
        "checked_steps_right_frac": claims_right / checked if checked else None,
        "prefix_right_share_mean": statistics.fmean(prefix_right_share) if prefix_right_share else None,
        "wrong_answers_first_step_right_frac": wrong_ans_first_right / wrong_ans if wrong_ans else None,
    }
    if agree[1]:
        out["labels_vs_verifier"] = {
            "steps": agree[1],
            "hard_label_agreement": agree[0] / agree[1],
            "verifier_good_frac": sum(mc_labels) / len(mc_labels),
            "auc_soft_label_for_verifier_good": auc(mc_scores, mc_labels),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("sample", "labels"))
    ap.add_argument("words", nargs="+", metavar="RECIPE | section.key=value")
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--prm", metavar="FOLDER", help="labels mode: also check this PRM (grpokit prm train's)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    positional, overrides = split_overrides(a.words)
    if len(positional) != 1:
        raise SystemExit(f"expected one RECIPE, got {positional}")
    recipe = command_recipe(find_recipe(positional[0]), overrides, {})
    start = time.time()
    groups = _sample(recipe, a.problems) if a.mode == "sample" else _from_labels(recipe)
    out = {"recipe": positional[0], "overrides": overrides, "mode": a.mode, **measure(recipe, groups)}
    if a.prm:
        out["prm_check"] = {"folder": a.prm, **prm_check(recipe, a.prm)}
    out["seconds"] = round(time.time() - start, 1)
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(text + "\n")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
