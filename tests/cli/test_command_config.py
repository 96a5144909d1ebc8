"""``grpokit sft`` and ``grpokit eval`` configured from the recipe schema: the ``sft`` section's defaults
and checks, the order in which a command line's parts apply (schema defaults < recipe < key=value <
flags), and ``grpokit sft RECIPE`` run end to end."""

from __future__ import annotations

import json

import pytest

from grpokit.cli.eval import DEFAULT_DATA_SEED, DEFAULT_MAX_NEW_TOKENS, _eval_args, _eval_recipe
from grpokit.cli.main import main
from grpokit.cli.recipe_args import DEFAULT_RECIPE
from grpokit.cli.sft import sft_job
from grpokit.config import RecipeError, SftConfig, load_recipe, recipe_from_dict

ROWS = [
    {"question": "Tom has 3 apples and gets 4 more. How many apples?", "answer": "7", "equation": "3 + 4 = 7"},
    {"question": "Ann had 9 pens and lost 2. How many pens now?", "answer": "7", "equation": "9 - 2 = 7"},
    {"question": "5 boxes hold 6 eggs each. How many eggs?", "answer": "30", "equation": "5 * 6 = 30"},
    {"question": "12 cakes shared by 4 kids. How many each?", "answer": "3", "equation": "12 / 4 = 3"},
]


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def write_recipe(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "values, msg",
    [
        ({"epochs": 0}, "sft.epochs: must be > 0, got 0"),
        ({"learning_rate": -1e-5}, "sft.learning_rate: must be > 0"),
        ({"batch_size": 0}, "sft.batch_size: must be > 0"),
        ({"warmup_steps": -1}, "sft.warmup_steps: must be >= 0"),
        ({"max_steps": 0}, "sft.max_steps: must be > 0, or -1"),
        ({"limit": 0}, "sft.limit: must be > 0 or null"),
        ({"prompt_template": "no field"}, "sft.prompt_template: 'no field' has no {question} field"),
        ({"completion_template": " "}, "sft.completion_template: empty"),
        ({"learning_rate": float("nan")}, "sft.learning_rate: expected a finite number"),
        ({"epochs": "two"}, "sft.epochs: expected float"),
        ({"epoch": 2}, "unknown recipe key sft.epoch; allowed in sft: model, dataset"),
    ],
)
def test_the_sft_section_is_checked_like_every_section(values, msg):
    with pytest.raises(RecipeError) as e:
        recipe_from_dict({"sft": values})
    assert msg in str(e.value)


def test_the_sft_defaults_are_the_commands_old_flag_defaults():
    s = SftConfig()
    assert (s.split, s.epochs, s.max_steps, s.learning_rate, s.batch_size, s.warmup_steps, s.seed) == (
        "test",
        1.0,
        -1,
        2e-5,
        16,
        10,
        0,
    )
    assert recipe_from_dict({}).sft == s and recipe_from_dict({"sft": None}).sft == s


def test_sft_reads_the_recipe_then_overrides_then_flags(tmp_path, rows_file):
    path = write_recipe(
        tmp_path,
        "model: {name_or_path: runs/warm}\n"
        f"sft: {{model: base-model, dataset: {rows_file}, completion_template: '{{equation}}', epochs: 2.0, "
        "learning_rate: 1.0e-4}\n",
    )
    job = sft_job([str(path)])
    assert (job.model, job.out, job.heldout_of) == ("base-model", "runs/warm", str(path))
    assert (job.recipe.sft.epochs, job.recipe.sft.learning_rate, job.recipe.sft.batch_size) == (2.0, 1e-4, 16)
    job = sft_job([str(path), "sft.epochs=3", "sft.batch_size=4"])
    assert (job.recipe.sft.epochs, job.recipe.sft.batch_size) == (3.0, 4)
    job = sft_job(["sft.epochs=3", str(path), "--epochs", "4", "--device", "auto"])  # flags last, in any order
    assert job.recipe.sft.epochs == 4.0 and job.recipe.model.device == "auto"
    # MODEL OUT with --heldout-of: that recipe's sft section too, the named model and folder
    job = sft_job(["m", "out", "--heldout-of", str(path), "--learning-rate", "3e-5"])
    assert (job.model, job.out, job.heldout_of) == ("m", "out", str(path))
    assert (job.recipe.sft.epochs, job.recipe.sft.learning_rate) == (2.0, 3e-5)
    # MODEL OUT alone: the demo recipe (its prompt template), no held-out check
    job = sft_job(["m", "out", "--dataset", "d", "--completion-template", "{equation}"])
    assert job.heldout_of is None
    assert job.recipe.data.prompt_template == load_recipe(DEFAULT_RECIPE).data.prompt_template


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--epochs", "0"], "--epochs: sft.epochs: must be > 0"),
        (["--max-steps", "0"], "--max-steps: sft.max_steps: must be > 0, or -1"),
        (["sft.seedd=1"], "unknown recipe key sft.seedd"),
        (["--heldout-of", "R"], "give the recipe once"),
        (["a", "b"], "expected RECIPE or MODEL OUT, got 3 arguments"),
    ],
)
def test_sft_names_the_flag_or_key_at_fault(tmp_path, rows_file, args, msg):
    path = write_recipe(
        tmp_path,
        f"model: {{name_or_path: runs/warm}}\nsft: {{model: m, dataset: {rows_file}, completion_template: '{{a}}'}}\n",
    )
    with pytest.raises(RecipeError) as e:
        sft_job([str(path), *args])
    assert msg in str(e.value)


def test_sft_says_which_setting_is_missing(tmp_path, rows_file):
    bare = write_recipe(tmp_path, "model: {name_or_path: runs/warm}\n")
    with pytest.raises(RecipeError, match=r"sft\.model: not set in .*r\.yaml.*runs/warm"):
        sft_job([str(bare)])
    with pytest.raises(RecipeError, match=r"sft\.dataset: not set; give --dataset NAME"):
        sft_job([str(bare), "sft.model=m"])
    with pytest.raises(RecipeError, match=r"sft\.completion_template: not set; give --completion-template"):
        sft_job([str(bare), "sft.model=m", f"sft.dataset={rows_file}"])
    with pytest.raises(RecipeError, match="would be written over its start"):
        sft_job([str(bare), "sft.model=runs/warm"])
    with pytest.raises(RecipeError, match="recipe file not found: nope.yaml.*or give MODEL OUT"):
        sft_job(["nope.yaml"])


def test_sft_help_lists_the_sections_keys(capsys):
    with pytest.raises(SystemExit) as e:
        sft_job(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "sft.learning_rate = 2e-05" in out and "sft.completion_template = None" in out
    assert "train.max_steps" not in out


def test_grpokit_sft_recipe_writes_the_recipes_model(tiny_model_dir, tmp_path, rows_file, capsys):
    """``grpokit sft RECIPE``: sft.model fine-tuned into model.name_or_path, the recipe's prompt
    template, its held-out question left out, the overrides applied."""
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"question": ROWS[2]["question"].lower(), "answer": "30"}) + "\n")
    out = tmp_path / "warm"
    path = write_recipe(
        tmp_path,
        f"model: {{name_or_path: {out}}}\ndata: {{prompt_template: 'Q: {{question}}'}}\n"
        f"eval: {{dataset: {held}, limit: 5}}\n"
        f"sft: {{model: {tiny_model_dir}, dataset: {rows_file}, completion_template: '{{equation}}', "
        "batch_size: 2}\n",
    )
    assert main(["sft", str(path), "sft.max_steps=2", "--learning-rate", "1e-3"]) == 0
    assert "3 rows" in capsys.readouterr().out
    info = json.loads((out / "sft_info.json").read_text())
    assert info["model"] == tiny_model_dir and info["prompt_template"] == "Q: {question}"
    assert (info["heldout_left_out"], info["steps"], info["batch_size"], info["learning_rate"]) == (1, 2, 2, 1e-3)
    assert (out / "config.json").is_file()
    assert main(["sft", str(path)]) == 1  # never written over
    assert "not empty" in capsys.readouterr().err


def test_eval_flags_and_overrides_set_the_eval_section():
    ns = _eval_args(["m", "--dataset", "mawps", "eval.limit=7", "eval.batch_size=3", "--batch-size", "5"])
    recipe, held = _eval_recipe(ns)
    assert held is None and (ns.dataset, ns.split, ns.limit, ns.batch_size) == ("mawps", "test", 7, 5)
    assert (recipe.eval.limit, recipe.eval.batch_size) == (7, 5)
    assert (ns.max_new_tokens, ns.data_seed, ns.skip, ns.samples, ns.device) == (
        DEFAULT_MAX_NEW_TOKENS,
        DEFAULT_DATA_SEED,
        0,
        None,
        "cpu",
    )
    ns = _eval_args(["m", "--dataset", "x", "--samples", "4", "--data-options", "{size: 9}", "eval.max_new_tokens=12"])
    recipe, _ = _eval_recipe(ns)
    assert (ns.samples, ns.data_options, ns.max_new_tokens) == (4, {"size": 9}, 12)
    assert recipe.eval.num_samples == 4
    ns = _eval_args(["m", "--dataset", "x", "--prompt-template", "no field"])
    with pytest.raises(RecipeError, match=r"--prompt-template: data\.prompt_template: 'no field' has no"):
        _eval_recipe(ns)
    with pytest.raises(RecipeError, match="give --dataset NAME"):
        _eval_recipe(_eval_args(["m", "eval.limit=5"]))


def test_eval_heldout_of_a_recipe_without_an_eval_dataset_says_so(tmp_path, capsys, rows_file):
    path = write_recipe(tmp_path, f"data: {{dataset: {rows_file}}}\n")
    assert main(["eval", "m", "--heldout-of", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--heldout-of {path}: eval.dataset: not set" in err and err.count("\n") == 1
    assert main(["eval", "m", "--heldout-of", str(path), f"eval.dataset={rows_file}", "eval.split=x"]) == 2
    # set by the override, it gets to the held-out rows: the same file's rows are all training rows
    assert "every held-out problem of" in capsys.readouterr().err
