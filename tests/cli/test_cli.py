"""grpokit.cli.main: ``grpokit train`` end to end on the tiny model, errors, and ``--help``."""

from __future__ import annotations

import pytest

import grpokit.models.loading
from grpokit.cli.main import main
from grpokit.metrics import read_metrics
from support.helpers import tiny_recipe_dict, write_recipe


@pytest.mark.curves
def test_train_writes_outputs(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tiny_model_dir, out))
    rc = main(["train", str(recipe), "train.max_steps=1", "algo.beta=0", "--no-progress"])
    assert rc == 0
    assert f"output: {out}" in capsys.readouterr().out
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl")] == [1]
    assert (out / "checkpoint-1" / "model.safetensors").is_file()
    assert (out / "curves.png").is_file() and (out / "summary.json").is_file()


def test_unknown_key_returns_2_before_loading(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(grpokit.models.loading, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tiny_model_dir, tmp_path))
    assert main(["train", str(recipe), "train.max_stepz=1"]) == 2
    err = capsys.readouterr().err
    assert "train.max_stepz" in err and "max_steps" in err


def test_train_help_lists_keys(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for key in (
        "rollout.group_size",
        "algo.beta",
        "train.max_steps",
        "rewards.on_error",
        "train.max_consecutive_skips",
        "model.trust_remote_code",
    ):
        assert key in out


def test_top_level_usage_and_unknown_command(capsys):
    assert main([]) == 0
    assert "train" in capsys.readouterr().out
    assert main(["fly"]) == 2
    assert "fly" in capsys.readouterr().err


def test_two_recipe_files_is_an_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["train", "a.yaml", "b.yaml"])
    assert e.value.code == 2


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".json"])
def test_non_utf8_data_file_exits_1_with_one_line(tmp_path, capsys, monkeypatch, suffix):
    """Data errors come before any model or tokenizer loads: the model folder need not exist."""
    monkeypatch.setattr(grpokit.models.loading, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.setattr(grpokit.models.loading, "load_tokenizer", lambda *a, **k: pytest.fail("tokenizer loaded"))
    head = {
        ".jsonl": b'{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n{"prompt": "caf',
        ".csv": b"prompt,answer\na,1\ncaf",
        ".json": b'[{"prompt": "a", "answer": "1"},\n{"prompt": "b", "answer": "2"},\n{"prompt": "caf',
    }[suffix]
    tail = {".jsonl": b'", "answer": "3"}\n', ".csv": b",3\n", ".json": b'", "answer": "3"}]'}[suffix]
    data = tmp_path / f"data{suffix}"
    data.write_bytes(head + b"\xe9" + tail)
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_recipe_dict(tmp_path / "no-model", tmp_path / "out", data={"dataset": str(data)})
    )
    assert main(["train", str(recipe), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"data.dataset='{data}': line 3: not valid UTF-8 (byte 0xe9 at offset {len(head)} of the file) " in err
    # where the values came from; data.split (line 6) is not named: a local file has no splits
    assert err.endswith(f" (from {recipe}: data.dataset line 4)\n") and "split" not in err
    assert err.count("\n") == 1 and err.startswith("grpokit train: error: data.dataset=")


def test_non_utf8_recipe_exits_2_with_one_line(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(b"data:\n  system_prompt: caf\xe9\n")
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"grpokit train: recipe error: recipe {recipe}: line 2: not valid UTF-8 "
        "(byte 0xe9 at offset 26 of the file)\n"
    )


@pytest.mark.parametrize(
    "error",
    [
        lambda: b"caf\xe9".decode("utf-8"),  # UnicodeDecodeError: a constructor of 5 arguments
        lambda: open("/nonexistent/grpokit-data.jsonl"),  # FileNotFoundError: kept as such
    ],
)
def test_any_data_error_is_rewrapped_without_failing(tmp_path, capsys, monkeypatch, error):
    """``section_rows`` adds the recipe keys to whatever a loader (HF, reasoning_gym, ...) raises."""
    import grpokit.data.rows

    monkeypatch.setattr(grpokit.data.rows, "load_data_rows", lambda *a, **k: error())
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe_dict(tmp_path / "no-model", tmp_path / "out"))
    assert main(["train", str(recipe), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("grpokit train: error: data.dataset='mawps' data.split='singleop': ")
    assert err.count("\n") == 1 and ("0xe9" in err or "grpokit-data.jsonl" in err)


# -- no traceback for a fault in the user's input (issue #29, item 10) ----------------------------


def _rows(path, rows) -> str:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _fault_case(case: str, model: str, tmp_path, monkeypatch) -> tuple[list[str], int, list[str]]:
    """``(argv, exit status, strings the one error line holds)`` of an input fault of issue #29."""
    made = []

    def recipe(**sections) -> str:  # every case's recipe is written (the table below is built whole): one file each
        made.append(1)
        return str(write_recipe(tmp_path / f"r{len(made)}.yaml", tiny_recipe_dict(model, tmp_path / "out", **sections)))

    a_file = tmp_path / "a_file"
    a_file.write_text("x\n")
    good = _rows(tmp_path / "good.jsonl", [{"question": "1+1?", "answer": "2"}, {"question": "2+3?", "answer": "5"}])
    eval_args = ["eval", model, "--dataset", "mawps", "--split", "singleop", "--limit", "2"]
    two = "rewards.functions=[format, math_correct]"
    sft_args = ["--dataset", good, "--split", "train", "--completion-template", "{answer}"]
    if case == "recipe_dir_not_writable":  # root passes every permission check: say what the OS would
        monkeypatch.setattr("os.access", lambda p, mode: str(p) != str(tmp_path / "ro"))
        (tmp_path / "ro").mkdir()
    return {
        # the recipe (exit 2)
        "unknown_key": (["train", recipe(), "train.max_stepz=1"], 2, ["train.max_stepz", "max_steps"]),
        "wrong_type": (
            ["train", recipe(), "train.max_steps=two"],
            2,
            ["train.max_steps", "(from the command line: train.max_steps)"],
        ),
        "override_without_section": (
            ["train", recipe(), "max_steps=3"],
            2,
            ["max_steps=3", "key must be section.name; use train.max_steps=3"],
        ),
        "duplicate_section": (
            ["train", str(write_text(tmp_path / "d.yaml", good_text(recipe()) + "train:\n  max_steps: 20\n"))],
            2,
            ["train"],
        ),
        "weights_element": (["train", recipe(), two, "rewards.weights=[1, x]"], 2, ["rewards.weights"]),
        "weights_nan": (["train", recipe(), two, "rewards.weights=[.nan, 1]"], 2, ["rewards.weights"]),
        "weights_bool": (["train", recipe(), two, "rewards.weights=[true, 1]"], 2, ["rewards.weights"]),
        "functions_element": (["train", recipe(), "rewards.functions=[3, format]"], 2, ["rewards.functions"]),
        "functions_null": (["train", recipe(), "rewards.functions=[null, format]"], 2, ["rewards.functions"]),
        "functions_twice": (
            ["train", recipe(), "rewards.functions=[format, format]", "rewards.weights=[1, 0.5]"],
            2,
            ["rewards.functions", "format"],
        ),
        "missing_recipe": (["train", str(tmp_path / "nope.yaml")], 2, ["nope.yaml", "arith, demo, feedback, long"]),
        "recipe_is_a_folder": (["train", str(tmp_path)], 2, [str(tmp_path), "cannot read"]),
        "recipe_not_yaml": (["train", str(write_text(tmp_path / "b.yaml", "train: [\n"))], 2, ["not valid YAML"]),
        # its output locations, before any model loads (exit 1)
        "output_dir_is_a_file": (
            ["train", recipe(train={"output_dir": str(a_file)})],
            1,
            [f"train.output_dir='{a_file}': is a file"],
        ),
        "output_dir_below_a_file": (
            ["train", recipe(), f"train.output_dir={a_file}/run"],
            1,
            [
                "train.output_dir=",
                "a_file is a file, so nothing can be made below it",
                "(from the command line: train.output_dir)",
            ],
        ),
        "recipe_dir_not_writable": (
            ["train", recipe(), f"train.output_dir={tmp_path}/ro/run"],
            1,
            ["train.output_dir=", "no permission"],
        ),
        # data, rewards, resume (exit 1)
        "data_file_missing": (
            ["train", recipe(), f"data.dataset={tmp_path}/missing.jsonl"],
            1,
            ["data.dataset", "missing.jsonl"],
        ),
        "data_bad_json": (
            [
                "train",
                recipe(
                    data={
                        "dataset": str(write_text(tmp_path / "b.jsonl", good_text(good) + "{broken\n")),
                        "split": "train",
                    }
                ),
            ],
            1,
            ["b.jsonl", "line 3"],
        ),
        "data_no_rows_left": (
            ["train", recipe(data={"dataset": good, "split": "train"}), "data.skip=5"],
            1,
            ["data.skip=5", "; from the command line: data.skip)"],
        ),
        "data_bad_messages": (
            [
                "train",
                recipe(
                    data={
                        "dataset": _rows(tmp_path / "m.jsonl", [{"prompt": [{"role": "user"}], "answer": "1"}]),
                        "split": "train",
                    }
                ),
            ],
            1,
            ["m.jsonl", "row 0"],
        ),
        "data_field_twice": (
            [
                "train",
                recipe(
                    data={
                        "dataset": str(
                            write_text(tmp_path / "t.jsonl", '{"question": "1+1", "answer": "2", "answer": "3"}\n')
                        ),
                        "split": "train",
                    }
                ),
            ],
            1,
            ["t.jsonl", "line 1", "'answer' is written twice"],
        ),
        "data_csv_column_twice": (
            [
                "train",
                recipe(
                    data={
                        "dataset": str(write_text(tmp_path / "t.csv", "question,answer,answer\n1+1,2,3\n")),
                        "split": "train",
                    }
                ),
            ],
            1,
            ["t.csv", "'answer' appears 2 times"],
        ),
        "reward_signature": (
            ["train", recipe(), "rewards.functions=[support.fake_rewards:one_argument_reward]", "rewards.weights=[1]"],
            1,
            ["support.fake_rewards:one_argument_reward", "signature"],
        ),
        "reward_module_missing": (
            ["train", recipe(), "rewards.functions=[no_such_module_xyz:exact]"],
            1,
            ["rewards.functions", "no_such_module_xyz"],
        ),
        "resume_not_a_checkpoint": (["train", recipe(), f"train.resume={tmp_path}"], 1, ["train.resume"]),
        # eval (exit 2), sft and export (exit 1)
        "eval_output_is_a_folder": ([*eval_args, "--output", str(tmp_path)], 2, ["--output", "is a folder"]),
        "eval_output_below_a_file": (
            [*eval_args, "--output", f"{a_file}/e.json"],
            2,
            ["--output", "nothing can be made below it"],
        ),
        "eval_data_options": ([*eval_args, "--data-options", "{size: ["], 2, ["--data-options", "not valid YAML"]),
        "eval_data_options_list": ([*eval_args, "--data-options", "[1, 2]"], 2, ["--data-options", "a mapping"]),
        "eval_temperature_nan": ([*eval_args, "--temperature", "nan"], 2, ["--temperature", "finite number"]),
        "eval_heldout_of_missing": (["eval", model, "--heldout-of", "nope"], 2, ["nope", "demo, feedback, long"]),
        "sft_out_is_a_file": (["sft", model, str(a_file), *sft_args], 1, ["OUT", "is a file"]),
        "sft_learning_rate_inf": (
            ["sft", model, str(tmp_path / "m"), *sft_args, "--learning-rate", "inf"],
            2,
            ["--learning-rate", "finite number"],
        ),
        "sft_out_below_a_file": (["sft", model, f"{a_file}/m", *sft_args], 1, ["OUT", "below it"]),
        "export_out_below_a_file": (["export", model, f"{a_file}/m"], 1, ["OUT", "below it"]),
        "export_not_a_checkpoint": (["export", str(tmp_path / "none"), str(tmp_path / "x")], 1, ["not a checkpoint"]),
    }[case]


def write_text(path, text: str):
    path.write_text(text)
    return path


def good_text(path: str) -> str:
    return open(path).read()


FAULTS = [
    "unknown_key",
    "wrong_type",
    "override_without_section",
    "duplicate_section",
    "weights_element",
    "weights_nan",
    "weights_bool",
    "functions_element",
    "functions_null",
    "functions_twice",
    "missing_recipe",
    "recipe_is_a_folder",
    "recipe_not_yaml",
    "output_dir_is_a_file",
    "output_dir_below_a_file",
    "recipe_dir_not_writable",
    "data_file_missing",
    "data_bad_json",
    "data_no_rows_left",
    "data_bad_messages",
    "data_field_twice",
    "data_csv_column_twice",
    "reward_signature",
    "reward_module_missing",
    "resume_not_a_checkpoint",
    "eval_output_is_a_folder",
    "eval_output_below_a_file",
    "eval_data_options",
    "eval_data_options_list",
    "eval_temperature_nan",
    "eval_heldout_of_missing",
    "sft_out_is_a_file",
    "sft_learning_rate_inf",
    "sft_out_below_a_file",
    "export_out_below_a_file",
    "export_not_a_checkpoint",
]


@pytest.mark.parametrize("case", FAULTS)
def test_an_input_fault_is_one_line_before_any_model_loads(tiny_model_dir, tmp_path, capsys, monkeypatch, case):
    """The rule of ``grpokit.cli.main``'s docstring: a fault in the user's input is one line naming the key,
    file or argument (no traceback), and it comes before any model loads; nothing is written."""
    monkeypatch.setattr(grpokit.models.loading, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    argv, status, needles = _fault_case(case, tiny_model_dir, tmp_path, monkeypatch)
    try:
        code, by_argparse = main([*argv, "--no-progress"] if argv[0] == "train" else argv), False
    except SystemExit as e:  # a flag argparse refuses: its usage block, then the one error line
        code, by_argparse = e.code, True
    assert code == status
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert lines and lines[-1].startswith(f"grpokit {argv[0]}: "), err
    if by_argparse:
        assert lines[0].startswith("usage: grpokit"), err
    else:
        assert all(line.startswith("[grpokit]") for line in lines[:-1]), err  # notes, then the one error line
    for n in needles:
        assert n in lines[-1], (n, lines[-1])
    assert not (tmp_path / "out").exists()


# -- no recipe, packaged recipes by name (issue #29, items 11 and 17) ------------------------------


@pytest.fixture
def captured(monkeypatch) -> list:
    """``grpokit train`` stops where training would start: the recipe it would run is appended."""
    import grpokit.trainer.loop

    seen = []
    monkeypatch.setattr(
        grpokit.trainer.loop, "train", lambda recipe, **k: seen.append(recipe) or {"nothing_to_do": True}
    )
    return seen


def test_no_recipe_runs_the_demo_and_says_so_first(captured, capsys):
    assert main(["train", "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("[grpokit] no recipe given: running the packaged demo recipe (")
    r = captured[0]  # the demo's values (recipes/demo.yaml), not the defaults of a recipe file
    assert (r.data.skip, r.train.max_steps, r.rewards.weights) == (100, 8, [1.0, 0.2])
    assert r.data.prompt_template == "{question}\nAnswer with just the number."


def test_own_data_or_rewards_without_a_recipe_do_not_inherit_the_demos(captured, capsys, tmp_path):
    """The demo's data.skip=100, prompt template and reward weights belong to its MAWPS rows."""
    assert (
        main(
            [
                "train",
                f"data.dataset={tmp_path}/qa.jsonl",
                "data.split=train",
                "rewards.functions=[support.fake_rewards:length_reward]",
            ]
        )
        == 0
    )
    first = capsys.readouterr().out.splitlines()[0]
    assert "data.dataset given, so the data section starts from the defaults" in first
    assert "rewards.functions given, so the rewards section starts from the defaults" in first
    r = captured[0]
    assert (r.data.dataset, r.data.split, r.data.skip, r.data.prompt_template) == (
        f"{tmp_path}/qa.jsonl",
        "train",
        0,
        "{question}",
    )
    assert (r.rewards.functions, r.rewards.weights) == (["support.fake_rewards:length_reward"], None)
    assert (r.train.max_steps, r.rollout.temperature) == (8, 0.7)  # the rest is still the demo's


def test_an_error_names_the_demo_recipe_as_the_values_source(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(grpokit.models.loading, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["train", "data.split=nope", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("grpokit train: error: data.dataset='mawps' data.split='nope': ")
    assert err.endswith(
        "(from the demo recipe (no recipe was given): data.dataset; from the command line: data.split)\n"
    )


def test_help_shows_the_values_that_apply_without_a_recipe(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "With no recipe the packaged demo recipe runs" in out
    for line in (
        "  data.skip = 0  (demo: 100)\n",
        "  train.max_steps = 20  (demo: 8)\n",
        "  rewards.weights = None  (demo: [1.0, 0.2])\n",
        "  algo.beta = 0.04\n",
    ):  # beta: the same in both
        assert line in out, line


@pytest.mark.parametrize("name", ["arith", "arith.yaml", "recipes/arith.yaml"])
def test_a_packaged_recipe_is_found_by_name_from_any_folder(captured, capsys, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert main(["train", name, "train.max_steps=3"]) == 0
    assert (captured[0].data.dataset, captured[0].train.max_steps) == ("reasoning_gym:basic_arithmetic", 3)
    assert "the packaged " in capsys.readouterr().out


def test_a_file_of_a_packaged_name_comes_first_and_unknown_names_list_the_packaged(
    captured, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arith.yaml").write_text("train:\n  max_steps: 2\n")
    assert main(["train", "arith.yaml"]) == 0 and captured[0].train.max_steps == 2
    assert main(["train", "arithmetic"]) == 2
    assert capsys.readouterr().err == (
        "grpokit train: recipe error: recipe file not found: arithmetic; the packaged "
        "recipes, found by name from any folder: arith, demo, feedback, long, ppo, process, steps, tools, tools_mawps\n"
    )


def test_a_recipe_error_found_by_the_run_exits_2_naming_the_values_source(tmp_path, capsys, monkeypatch):
    """E.g. a key that a checkpoint holds and that cannot change on resume (read before any model loads)."""
    import grpokit.trainer.loop
    from grpokit.config import RecipeError

    def refuse(recipe, **k):
        raise RecipeError("rollout.group_size: 8 -> 4 cannot change on resume")

    monkeypatch.setattr(grpokit.trainer.loop, "train", refuse)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "rollout.group_size=4"]) == 2
    assert capsys.readouterr().err == (
        "grpokit train: recipe error: rollout.group_size: 8 -> 4 cannot change on "
        "resume (from the command line: rollout.group_size)\n"
    )
