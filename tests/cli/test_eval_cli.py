"""``grpokit eval``: intervals, samples, a paired comparison, and bad input refused before any model
loads."""

from __future__ import annotations

import json

import pytest

import grpokit.models.loading
from grpokit.cli.main import main


@pytest.fixture
def load_model_raises(monkeypatch):
    """``load_model`` raises AssertionError: a refused call never gets there, a valid one does."""

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(grpokit.models.loading, "load_model", boom)


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--samples", "0"], "--samples must be >= 1"),
        (["--against", "./no/such/checkpoint-20"], "no/such/checkpoint-20"),
        (["--scorer", "reasoning_gym"], "scorer 'reasoning_gym' needs reasoning_gym: data"),
        (["--scorer", "no_such_reward"], "unknown reward 'no_such_reward'"),
        (["--skip", "100", "--limit", "5", "--dataset", "svamp"], None),  # svamp's test split has rows past 100
    ],
)
def test_bad_input_is_refused_before_any_model_loads(tiny_model_dir, tmp_path, capsys, load_model_raises, args, msg):
    base = [
        tiny_model_dir,
        "--dataset",
        "mawps",
        "--split",
        "singleop",
        "--limit",
        "4",
        "--output",
        str(tmp_path / "e.json"),
    ]
    if msg is None:  # a valid call reaches the model load
        with pytest.raises(AssertionError, match="a model was loaded"):
            main(["eval", *base, "--split", "test", *args])
        return
    assert main(["eval", *base, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grpokit eval: error: ") and msg in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_run_folder_stands_for_its_newest_complete_checkpoint(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import shutil

    run = tmp_path / "run"
    for step, complete in ((10, True), (20, True), (30, False), (9, True)):
        ck = shutil.copytree(tiny_model_dir, run / f"checkpoint-{step}")
        if complete:
            (ck / "trainer_state.json").write_text("{}")
    loaded = []

    def record(path, **_):
        loaded.append(path)
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(grpokit.models.loading, "load_model", record)
    with pytest.raises(AssertionError, match="a model was loaded"):  # checkpoint-30 is incomplete: step 20
        main(
            ["eval", tiny_model_dir, "--against", str(run), "--dataset", "mawps", "--split", "singleop", "--limit", "2"]
        )
    assert f"newest complete checkpoint, {run / 'checkpoint-20'}" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        main(["eval", str(run), "--dataset", "mawps", "--split", "singleop", "--limit", "2"])
    assert loaded == [tiny_model_dir, str(run / "checkpoint-20")]
    for step in (9, 10, 20):  # no complete checkpoint left: refused before any model loads
        (run / f"checkpoint-{step}" / "trainer_state.json").unlink()
    assert main(["eval", str(run), "--dataset", "mawps", "--split", "singleop", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "run folder without a complete checkpoint" in err and str(run) in err and len(loaded) == 2


def test_eval_prints_intervals_samples_and_a_paired_test(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "new" / "e.json"  # a folder that does not exist yet is made
    assert (
        main(
            [
                "eval",
                tiny_model_dir,
                "--against",
                tiny_model_dir,
                "--dataset",
                "mawps",
                "--split",
                "singleop",
                "--limit",
                "3",
                "--samples",
                "2",
                "--max-new-tokens",
                "4",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    r = res["models"][tiny_model_dir]
    assert r["total"] == 3 and len(r["outcomes"]) == 3
    names = set(r["metrics"]["metrics"])
    assert {"greedy", "mean@2", "pass@1", "pass@2", "maj@2"} <= names
    for m in r["metrics"]["metrics"].values():
        assert 0.0 <= m["lo"] <= m["value"] <= m["hi"] <= 1.0
    pc = res["paired"]  # the same model against itself: no discordant pair
    assert (pc["diff"], pc["b_only"], pc["a_only"], pc["p_value"]) == (0.0, 0, 0, 1.0)
    # per-problem sampled outcomes: they add up to the summary's mean@2 and maj@2
    assert len(r["sampled_correct"]) == 3 and all(0 <= c <= 2 for c in r["sampled_correct"])
    assert sum(r["sampled_correct"]) / 6 == pytest.approx(r["metrics"]["metrics"]["mean@2"]["value"])
    assert sum(r["maj_outcomes"]) / 3 == pytest.approx(r["metrics"]["metrics"]["maj@2"]["value"])
    ps = res["paired_sampled"]  # same seed, same model: the same samples
    assert (ps["mean@2"]["diff"], ps["mean@2"]["p_value"], ps["maj@2"]["diff"]) == (0.0, 1.0, 0.0)
    text = capsys.readouterr().out
    assert "exact McNemar p = 1" in text and "pass@2" in text and "95%" in text.replace(" %", "%")
    assert "mean@2: +0.000" in text and "exact sign test p = 1" in text


def test_scores_of_none_are_counted_unscorable(tiny_model, smollm2_tokenizer, smollm2_prompts):
    from grpokit.eval.evaluate import evaluate
    from grpokit.rollout.engine import load_engine

    rows = [{"prompt": "q", "answer": "1"}, {"prompt": "r", "answer": "2"}]
    engine = load_engine("hf", model=tiny_model, tokenizer=smollm2_tokenizer, eos_token_ids=[2, 0])
    res = evaluate(
        engine, smollm2_prompts, rows, max_new_tokens=2, scorer=lambda p, c, **_: [None] * len(c), num_samples=2
    )
    assert res["unscorable"] == 2 + 2 * 2 and res["accuracy"] == 0.0  # greedy and sampled


def test_maj_votes_read_answers_as_the_scorer_does():
    from grpokit.data.heldout import answer_extractor

    text = "I think 3, then <answer>cab</answer>"
    assert answer_extractor("reasoning_gym")(text) == "cab"
    assert answer_extractor("math_correct")(text) == "3"


@pytest.mark.slow
def test_heldout_of_a_recipe_evaluates_the_runs_heldout_problems(tiny_model_dir, tmp_path, capsys):
    # a local file: rows 0-2 held out, 3-5 trained on; row 1's question is also training row 4's
    qs = ["What is 1 + 1?", "What is 2 + 2?", "What is 3 + 3?", "What is 4 + 4?", "What is 2 + 2?", "What is 5 + 5?"]
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "0"}) + "\n" for q in qs))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {{name_or_path: {tiny_model_dir}}}\ndata: {{dataset: {data}, skip: 3, "
        "prompt_template: 'Q: {question}'}\neval: {dataset: "
        f"{data}, limit: 3, max_new_tokens: 3}}\n"
    )
    out = tmp_path / "e.json"
    assert main(["eval", tiny_model_dir, "--heldout-of", str(recipe), "--output", str(out)]) == 0
    res = json.loads(out.read_text())
    r = res["models"][tiny_model_dir]
    assert r["total"] == 2 and res["dataset"] == str(data)
    printed = capsys.readouterr().out
    assert "2 held-out problems" in printed and "(1 left out as training questions" in printed
    # the flags and section.key=value words change the recipe's eval section (flags last)
    for extra, total, left_out in (
        (["--limit", "2"], 1, 1),  # rows 0-1: "2 + 2" is a training question
        (["eval.limit=1"], 1, 0),
        (["eval.limit=1", "--limit", "3"], 2, 1),
    ):
        cmd = ["eval", tiny_model_dir, "--heldout-of", str(recipe), *extra, "--output", str(out), "--overwrite"]
        assert main(cmd) == 0
        assert json.loads(out.read_text())["models"][tiny_model_dir]["total"] == total
        assert f"({left_out} left out as training questions" in capsys.readouterr().out
    for extra, msg in (
        (["--skip", "1"], "--skip: not with --heldout-of"),
        (["--limit", "0"], "--limit: eval.limit: must be > 0"),
        (["eval.limitt=1"], "unknown recipe key eval.limitt"),
        (["stray"], "unexpected argument 'stray'"),
    ):
        assert main(["eval", tiny_model_dir, "--heldout-of", str(recipe), *extra, "--output", str(out)]) == 2
        assert msg in capsys.readouterr().err
    assert main(["eval", tiny_model_dir, "--heldout-of", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_warns_of_cut_answers_records_its_settings_and_never_overwrites(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    from grpokit.cli.recipe_args import DEFAULT_RECIPE
    from grpokit.config import load_recipe

    out = tmp_path / "e.json"
    args = [
        "eval",
        tiny_model_dir,
        "--dataset",
        "mawps",
        "--split",
        "singleop",
        "--limit",
        "2",
        "--max-new-tokens",
        "2",
        "--samples",
        "2",
        "--temperature",
        "0.7",
        "--seed",
        "5",
        "--output",
        str(out),
    ]
    assert main(args) == 0
    err = capsys.readouterr().err  # a random tiny model never ends an answer within 2 tokens
    assert (
        f"[grpokit] warning: {tiny_model_dir}: 100% of the greedy completions reached --max-new-tokens=2 "
        "without an EOS: an answer cut off there is scored as it stands, usually wrong"
    ) in err
    res = json.loads(out.read_text())
    demo = load_recipe(DEFAULT_RECIPE).data
    want = {
        "prompt_template": demo.prompt_template,
        "system_prompt": demo.system_prompt,
        "chat_template": True,
        "max_new_tokens": 2,
        "greedy": True,
        "samples": 2,
        "temperature": 0.7,
        "seed": 5,
        "limit": 2,
        "skip": 0,
    }
    assert {k: res["settings"][k] for k in want} == want
    r = res["models"][tiny_model_dir]
    assert r["truncated_frac"] == 1.0 and r["settings"]["max_new_tokens"] == 2 and r["settings"]["seed"] == 5
    ex = r["examples"][0]  # the prompt the model was given: the question in the template, chat-templated
    assert ex["prompt"].startswith("<|im_start|>") and ex["question"] in ex["prompt"] and ex["truncated"] is True
    before = out.read_bytes()
    assert main(args) == 2  # an existing output is refused before any model loads, and left as it was
    err = capsys.readouterr().err
    assert err == (
        f"grpokit eval: error: --output {out}: exists; name another file with --output, or pass "
        "--overwrite to replace it\n"
    )
    assert out.read_bytes() == before
    out.write_text("{}")
    assert main([*args, "--overwrite"]) == 0 and json.loads(out.read_text())["settings"]["seed"] == 5
    # the default output: eval_<dataset>_<split>.json in the working folder, a data file's name without folders
    data = tmp_path / "data" / "q.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    (tmp_path / "eval_q_test.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", tiny_model_dir, "--dataset", str(data)]) == 2
    assert "--output eval_q_test.json: exists (the default output file)" in capsys.readouterr().err


@pytest.mark.slow
def test_the_settings_of_a_heldout_eval_are_the_values_used_and_rerun_it(tiny_model_dir, tmp_path):
    """``--heldout-of RECIPE train.seed=S`` reads generated rows with data seed S + 10^9: the JSON's
    ``settings.data_seed`` says so (not the default 10^9), and the recorded settings alone — the
    recipe and its overrides, or ``--dataset`` with those seeds and options — give the same problems."""
    pytest.importorskip("reasoning_gym")
    task = "reasoning_gym:basic_arithmetic"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {{name_or_path: {tiny_model_dir}}}\ndata: {{dataset: '{task}', options: {{size: 20}}}}\n"
        f"eval: {{dataset: '{task}', limit: 3, max_new_tokens: 2, options: {{size: 20}}}}\n"
    )

    def questions(path):
        res = json.loads(path.read_text())
        return res["settings"], [e["question"] for e in res["models"][tiny_model_dir]["examples"]]

    first = tmp_path / "a.json"
    assert (
        main(
            [
                "eval",
                tiny_model_dir,
                "--heldout-of",
                str(recipe),
                "train.seed=424242",
                "--limit",
                "2",
                "--output",
                str(first),
            ]
        )
        == 0
    )
    settings, asked = questions(first)
    assert settings["data_seed"] == 1000424242 and settings["skip"] == 0 and settings["shuffle_seed"] is None
    assert settings["overrides"] == ["train.seed=424242", "eval.limit=2"]
    default = tmp_path / "d.json"
    assert main(["eval", tiny_model_dir, "--heldout-of", str(recipe), "--limit", "2", "--output", str(default)]) == 0
    assert questions(default)[1] != asked  # the seed matters: another seed, other problems
    again = tmp_path / "b.json"
    assert (
        main(
            [
                "eval",
                tiny_model_dir,
                "--heldout-of",
                settings["heldout_of"],
                *settings["overrides"],
                "--output",
                str(again),
            ]
        )
        == 0
    )
    assert questions(again)[1] == asked
    flags = ["--dataset", task, "--limit", str(settings["limit"]), "--data-seed", str(settings["data_seed"])]
    flags += ["--skip", str(settings["skip"]), "--data-options", json.dumps(settings["data_options"])]
    by_flags = tmp_path / "c.json"
    assert main(["eval", tiny_model_dir, *flags, "--max-new-tokens", "2", "--output", str(by_flags)]) == 0
    assert questions(by_flags)[1] == asked
