"""PRM training on step labels (grpokit.process.prm_train): the loss by hand, the rows, the split,
a tiny model that learns a pattern, and the folder loaded back as a TokenProbPRM."""

import json
import math

import pytest
import torch

from grpokit.process.labels import StepLabels
from grpokit.process.prm import StepLayout, TokenProbPRM
from grpokit.process.prm_train import (
    PRM_INFO,
    PRMExample,
    PRMSpec,
    evaluate_prm,
    load_prm,
    prm_collate,
    prm_examples,
    prm_loss,
    split_by_problem,
    train_prm,
)


def _rec(problem, sample, question, steps, hard, soft=None):
    return StepLabels(
        problem=problem,
        sample=sample,
        question=question,
        prompt=f"Q: {question}",
        answer="1",
        steps=steps,
        hard=hard,
        soft=soft if soft is not None else [float(h) for h in hard],
        truncated=False,
        samples_per_problem=2,
        rollouts_per_step=4,
        seed=0,
        step_rule="lines",
        threshold=1.0,
    )


def test_prm_loss_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    pos = torch.tensor([[1, 3, -1], [4, -1, -1]])
    targets = torch.tensor([[1.0, 0.25, 0.9], [0.0, 0.5, 0.5]])  # padded targets must not count
    good, bad = 2, 5
    want = []
    for b, k in [(0, 0), (0, 1), (1, 0)]:
        z = logits[b, pos[b, k]]
        p = math.exp(z[good]) / (math.exp(z[good]) + math.exp(z[bad]))
        y = float(targets[b, k])
        want.append(-(y * math.log(p) + (1 - y) * math.log(1 - p)))
    got = prm_loss(logits, pos, targets, [good, bad])
    assert got.item() == pytest.approx(sum(want) / 3, rel=1e-6)
    # gradients reach the tag positions' two candidates only
    x = logits.clone().requires_grad_(True)
    prm_loss(x, pos, targets, [good, bad]).backward()
    nz = (x.grad != 0).nonzero().tolist()
    assert sorted(map(tuple, nz)) == sorted([(0, 1, 2), (0, 1, 5), (0, 3, 2), (0, 3, 5), (1, 4, 2), (1, 4, 5)])


@pytest.mark.parametrize(
    "pos, targets, match",
    [
        ([[-1]], [[1.0]], "no step tag"),
        ([[0]], [[1.5]], r"targets must lie in \[0, 1\]"),
        ([[0, 1]], [[1.0]], "must be .B, L, V., tag_positions"),
    ],
)
def test_prm_loss_bad_input(pos, targets, match):
    with pytest.raises(ValueError, match=match):
        prm_loss(torch.zeros(1, 3, 4), torch.tensor(pos), torch.tensor(targets), [0, 1])


def test_examples_follow_the_scoring_layout(smollm2_tokenizer):
    tok = smollm2_tokenizer
    spec = PRMSpec()
    layout = spec.layout(tok)
    recs = [
        _rec(0, 0, "What is 2+3?", ["2+3 = 5\n", "The answer is 5"], [1, 1], [1.0, 0.75]),
        _rec(0, 1, "What is 2+3?", [], []),  # no steps: no row
        _rec(1, 0, "What is 4*4?", ["4*4 = 15\n", "So 15"], [0, 0]),
    ]
    rows, dropped = prm_examples(recs, layout, "soft")
    assert dropped == 0 and len(rows) == 2
    ids, positions = StepLayout(tok, "ки").build("What is 2+3?", ["2+3 = 5\n", "The answer is 5"])
    assert rows[0] == PRMExample(ids, positions, [1.0, 0.75])
    # the same ids the PRM scores, the tag's last id at each position
    prm = TokenProbPRM(torch.nn.Linear(1, 1), tok, "ки", "+", "-")
    assert prm.build("What is 2+3?", ["2+3 = 5\n", "The answer is 5"]) == (ids, positions)
    assert [ids[p] for p in positions] == [layout.tag_ids[-1]] * 2
    assert prm_examples(recs, layout, "hard")[0][0].targets == [1.0, 1.0]
    # cut at max_length: the first tag kept, the second dropped; a row with no tag left is dropped
    cut, dropped = prm_examples(recs[:1], layout, "hard", max_length=positions[0] + 1)
    assert cut == [PRMExample(ids[: positions[0] + 1], positions[:1], [1.0])] and dropped == 0
    assert prm_examples(recs[:1], layout, "hard", max_length=positions[0]) == ([], 1)
    with pytest.raises(ValueError, match="label must be one of"):
        prm_examples(recs, layout, "mixed")
    with pytest.raises(ValueError, match="problem 3 sample 1: question must be a string"):
        prm_examples([_rec(3, 1, {"q": 1}, ["a"], [1])], layout)


def test_collate_pads_tags_with_minus_one():
    b = prm_collate([PRMExample([5, 6, 7], [1, 2], [1.0, 0.0]), PRMExample([8], [0], [0.5])], pad_token_id=2)
    assert b["input_ids"].tolist() == [[5, 6, 7], [8, 2, 2]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["tag_positions"].tolist() == [[1, 2], [0, -1]]
    assert b["targets"].tolist() == [[1.0, 0.0], [0.5, 0.0]]


def test_split_keeps_a_problems_solutions_together():
    recs = [_rec(p, s, f"q{p}", ["x"], [1]) for p in range(20) for s in range(3)]
    train, held = split_by_problem(recs, 0.25, seed=1)
    held_q = {r.question for r in held}
    assert len(held_q) == 5 and len(held) == 15 and len(train) == 45
    assert not held_q & {r.question for r in train}
    again = split_by_problem(list(reversed(recs)), 0.25, seed=1)[1]
    assert {r.question for r in again} == held_q  # not the records' order
    assert {r.question for r in split_by_problem(recs, 0.25, seed=2)[1]} != held_q
    assert split_by_problem(recs, 0.0)[1] == []
    with pytest.raises(ValueError, match="eval_fraction must be in"):
        split_by_problem(recs, 1.0)


def test_spec_tokens_are_checked(smollm2_tokenizer):
    with pytest.raises(ValueError, match="good_token 'ки' must be a single token"):
        PRMSpec(good_token="ки").candidate_ids(smollm2_tokenizer)
    with pytest.raises(ValueError, match="are the same token"):
        PRMSpec(good_token="+", bad_token="+").candidate_ids(smollm2_tokenizer)


def _pattern_records(n_problems=24):
    """Steps that say 'right' are good, 'wrong' bad: a pattern a tiny model can learn."""
    recs = []
    for p in range(n_problems):
        q = f"Problem {p}: add {p} and {p + 1}."
        recs.append(_rec(p, 0, q, ["right step\n", "right step\n", "right end"], [1, 1, 1]))
        recs.append(_rec(p, 1, q, ["right step\n", "wrong step\n", "wrong end"], [1, 0, 0]))
    return recs


@pytest.mark.slow
def test_a_tiny_model_learns_step_labels_and_loads_back(tmp_path, make_tiny_model, smollm2_tokenizer):
    tok = smollm2_tokenizer
    model = make_tiny_model(seed=3)
    recs = _pattern_records()
    out = tmp_path / "prm"
    info = train_prm(
        model, tok, recs, out, eval_fraction=0.25, max_steps=40, learning_rate=3e-3, batch_size=8, warmup_steps=2
    )
    assert info["problems_eval"] == 6 and info["problems_train"] == 18 and info["rows"] == 36
    assert info["steps"] == 40 and len(info["losses"]) == 40
    assert sum(info["losses"][-5:]) / 5 < 0.5 * sum(info["losses"][:5]) / 5
    before, after = info["eval_before"], info["eval_after"]
    assert before["steps"] == after["steps"] == 36
    assert after["auc"] == 1.0 and after["step_accuracy"] == 1.0 and after["first_wrong_f1"] == 1.0
    assert before["auc"] < 1.0
    on_disk = json.loads((out / PRM_INFO).read_text())
    assert on_disk["spec"] == {"step_tag": "ки", "good_token": "+", "bad_token": "-", "step_suffix": "\n"}
    assert on_disk["eval_after"] == after
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    # the folder scores as the trained model did
    held = split_by_problem(recs, 0.25, 0)[1]
    prm = load_prm(out)
    assert isinstance(prm, TokenProbPRM)
    assert evaluate_prm(prm, held) == after
    live = TokenProbPRM(model, tok, "ки", "+", "-", max_length=512)
    q, steps = held[1].question, held[1].steps
    assert prm([q], [""], [steps])[0] == pytest.approx(live([q], [""], [steps])[0], abs=1e-5)


def test_train_prm_refuses_bad_input_before_training(tmp_path, make_tiny_model, smollm2_tokenizer):
    model, tok = make_tiny_model(), smollm2_tokenizer
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(FileExistsError, match="OUT"):
        train_prm(model, tok, _pattern_records(2), tmp_path / "full")
    with pytest.raises(ValueError, match="no training record has steps"):
        train_prm(model, tok, [_rec(0, 0, "q", [], [])], tmp_path / "a")
    with pytest.raises(ValueError, match="bad_token"):
        train_prm(model, tok, _pattern_records(2), tmp_path / "b", spec=PRMSpec(bad_token="ки"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_load_prm_refuses_a_folder_without_its_info(tmp_path):
    with pytest.raises(FileNotFoundError, match="no prm_info.json"):
        load_prm(tmp_path)
    (tmp_path / PRM_INFO).write_text(json.dumps({"spec": {"tag": "x"}}))
    with pytest.raises(ValueError, match="no valid 'spec'"):
        load_prm(tmp_path)


@pytest.mark.slow
def test_recipe_names_a_trained_prm(tmp_path, make_tiny_model, smollm2_tokenizer):
    """``algo.process_reward: prm:FOLDER`` scores steps as the loaded folder does, in a thread."""
    from grpokit.process.wiring import resolve_process_reward
    from support.helpers import tiny_recipe

    out = tmp_path / "prm"
    train_prm(make_tiny_model(seed=1), smollm2_tokenizer, _pattern_records(4), out, eval_fraction=0.0, max_steps=2)
    recipe = tiny_recipe(
        str(out), tmp_path / "run", algo={"process_reward": f"prm:{out}"}, rewards={"rm_batch_size": 1}
    )
    guard = resolve_process_reward(recipe)
    assert guard.isolation == "thread"
    steps = [["right step\n", "wrong end"], ["a\n"]]
    want = load_prm(out)(["q1", "q2"], ["", ""], steps)
    got = guard(["q1", "q2"], ["", ""], steps=steps)
    assert [[pytest.approx(v, abs=1e-6) for v in row] for row in want] == got
    bad = tiny_recipe(str(out), tmp_path / "run", algo={"process_reward": f"prm:{tmp_path}"})
    with pytest.raises(ValueError, match=r"algo.process_reward: 'prm:.*no prm_info.json"):
        resolve_process_reward(bad)
