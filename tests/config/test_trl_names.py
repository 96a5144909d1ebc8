"""Coming from TRL (grpokit.config.trl_names, docs/from_trl.md): the table of TRL names cannot name a key
that is not in the recipe, nor a value the key refuses; ``grpokit train`` answers TRL's names, flags and
keys without their section with the grpokit form, and a misspelt key with the closest one (one line,
exit status 2, nothing loaded); ``grpokit train --help`` ends with the section for TRL users."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpokit.cli.main import main
from grpokit.config import RecipeError, load_recipe
from grpokit.config.fields import choices_of
from grpokit.config.schema import Recipe, walk_recipe
from grpokit.config.trl_names import TRL_NAMES, grpokit_form, recipe_keys

DOC = Path(__file__).resolve().parents[2] / "docs" / "from_trl.md"


#: keys whose values need another key set to be accepted (a combination the recipe checks)
COMPANIONS = {"algo.is_correction": ["algo.tis_cap=2", "rollout.engine=vllm"]}


def test_every_key_and_value_of_the_table_is_the_recipes():
    keys = recipe_keys()
    fields = {key: f for key, _, f in walk_recipe(Recipe())}
    assert keys == set(fields)
    for name, trl in TRL_NAMES.items():
        if trl.key is None:
            assert trl.note, name  # no equivalent: the note says what grpokit does instead
            continue
        assert trl.key in keys, (name, trl.key)
        allowed = choices_of(fields[trl.key])
        for value in (trl.values or {}).values():  # a TRL value written otherwise is a value the key takes
            assert allowed is None or value in allowed, (name, trl.key, value, allowed)
            load_recipe(None, [f"{trl.key}={value}", *COMPANIONS.get(trl.key, [])])


def test_the_docs_page_lists_every_name_of_the_table():
    text = DOC.read_text()
    missing = [name for name in TRL_NAMES if f"`{name}`" not in text]
    assert not missing
    for trl in TRL_NAMES.values():
        assert trl.key is None or f"`{trl.key}`" in text, trl.key


def answer(capsys, *args: str) -> str:
    """``grpokit train ARGS``'s one-line error (exit status 2)."""
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


@pytest.mark.parametrize(
    "args, said",
    [
        (["--max_steps=2"], "grpokit train: recipe error: --max_steps=2: use train.max_steps=2"),
        (["--max-steps", "2"], "grpokit train: recipe error: --max-steps 2: use train.max_steps=2"),
        (
            ["--train.max_steps=2"],
            "grpokit train: recipe error: --train.max_steps=2: use train.max_steps=2: "
            "a recipe key is written without dashes",
        ),
        (
            ["max_steps=2"],
            "grpokit train: recipe error: override 'max_steps=2': key must be section.name; use train.max_steps=2",
        ),
        (
            ["num_generations=8"],
            "grpokit train: recipe error: override 'num_generations=8': key must be section.name; "
            "num_generations is TRL's name; grpokit: rollout.group_size=8",
        ),
        (
            ["--num_generations", "8"],
            "--num_generations 8: num_generations is TRL's name; grpokit: rollout.group_size=8",
        ),
        (["loss_type=dapo"], "loss_type is TRL's name; grpokit: algo.loss_aggregation=token_mean"),
        (["split=test"], "use data.split=test or eval.split=test"),
        (["--gradient_accumulation_steps=4"], "gradient_accumulation_steps is TRL's name; grpokit has no equivalent"),
    ],
)
def test_trl_names_and_keys_without_their_section_get_the_grpokit_form(capsys, no_model_load, args, said):
    err = answer(capsys, *args)
    assert said in err
    assert not err.endswith(")")  # no "(defaults: ...)" note: the keys it names are advice


@pytest.mark.parametrize(
    "args, said",
    [
        (["train.max_step=2"], "; did you mean train.max_steps?"),
        (["rollout.beta=0.1"], "; did you mean algo.beta?"),  # a key in the wrong section
        (["train.num_generations=8"], "; did you mean rollout.group_size? (num_generations is TRL's name)"),
        (["trian.max_steps=2"], "unknown recipe section 'trian'; allowed: model, data"),
    ],
)
def test_an_unknown_key_gets_the_closest_one(capsys, no_model_load, args, said):
    err = answer(capsys, *args)
    assert said in err
    if "section" not in said:  # the message it had, the allowed keys of the section, is kept
        assert f"unknown recipe key {args[0].split('=')[0]}; allowed in {args[0].split('.')[0]}: " in err


def test_an_unknown_key_of_a_recipe_file_gets_the_closest_one(tmp_path, capsys, no_model_load):
    path = tmp_path / "r.yaml"
    path.write_text("model:\n  name_or_path: x\ntrain:\n  max_step: 2\n")
    err = answer(capsys, str(path))  # the file and the key's line, as a compiler says it
    assert err.startswith(
        f"grpokit train: recipe error: {path}:4: unknown recipe key train.max_step; allowed in train: "
    )
    assert err.endswith("; did you mean train.max_steps?")
    path.write_text("modle:\n  name_or_path: x\n")
    assert answer(capsys, str(path)).startswith(
        f"grpokit train: recipe error: {path}:1: unknown recipe section 'modle'"
    )
    other = tmp_path / "q.yaml"
    other.write_text("model:\n  name_or_pth: x\n")
    with pytest.raises(RecipeError, match=r"q\.yaml:2: unknown recipe key model\.name_or_pth; "):
        load_recipe(other)  # the Python API's and grpokit eval's read too
    other.write_text("model:\n  name_or_path: y\n")
    with pytest.raises(RecipeError, match=r"^unknown recipe key train\.max_stepz; "):  # an override's: no file line
        load_recipe(other, ["train.max_stepz=1"])


def test_a_flat_trl_style_file_is_answered_with_each_names_key_and_line(tmp_path, capsys, no_model_load):
    path = tmp_path / "trl.yaml"
    path.write_text("model_name_or_path: org/m\nlearning_rate: 1.0e-5\nnum_generations: 4\nfoo_bar: 1\n")
    err = answer(capsys, str(path))
    assert err.startswith(f"grpokit train: recipe error: recipe {path}: a recipe's top level holds sections (model, ")
    assert err.endswith(
        "not TRL's flat names: line 1: model_name_or_path is TRL's name; grpokit: model.name_or_path=org/m; "
        "line 2: use train.learning_rate=1e-05; line 3: num_generations is TRL's name; grpokit: rollout.group_size=4; "
        "line 4: foo_bar is neither a recipe key's name nor TRL's"
    )
    with pytest.raises(RecipeError, match=r"unknown recipe key train\.nonsense; allowed in train: [a-z_, ]+$"):
        load_recipe(None, ["train.nonsense=1"])  # nothing close: no suggestion


def test_grpokit_form_names_nothing_for_other_names():
    assert grpokit_form("no_such_name", "1") is None
    assert grpokit_form("max-steps") == "use train.max_steps=VALUE"  # dashes as underscores, no value given
    assert grpokit_form("model", "org/m") == "model is TRL's name; grpokit: model.name_or_path=org/m"


def test_train_help_ends_with_the_section_for_trl_users(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    section = out[out.index("coming from TRL") :]
    assert "docs/from_trl.md" in section
    for line in ("num_generations              -> rollout.group_size", "beta                         -> algo.beta"):
        assert line in section, line
    assert "dapo: token_mean" in section
