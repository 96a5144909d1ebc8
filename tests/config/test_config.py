"""grpokit.config: the recipe dataclasses, validation messages, dotted overrides, help text."""

from __future__ import annotations

import dataclasses
import re

import pytest

from grpokit.cli.recipe_args import DEFAULT_RECIPE, packaged_recipes
from grpokit.config import (
    Recipe,
    RecipeError,
    help_text,
    load_recipe,
    parse_override,
    recipe_from_dict,
)


def test_defaults_and_demo_recipe_validate():
    recipe_from_dict({})
    r = load_recipe(DEFAULT_RECIPE)
    assert r.rollout.group_size == 8 and r.algo.beta == 0.04
    assert r.model.trust_remote_code is False  # safe default


def _error_setting(key: str, value) -> str:
    """The RecipeError message for a recipe that sets only ``key`` (``section.name``) to ``value``."""
    sec, name = key.split(".")
    with pytest.raises(RecipeError) as e:
        recipe_from_dict({sec: {name: value}})
    return str(e.value)


@pytest.mark.parametrize(
    "raw, names",
    [
        ({"train": {"max_stepz": 3}}, ["train.max_stepz", "max_steps"]),  # lists what is allowed
        ({"trainer": {}}, ["'trainer'", "train"]),
        ({"rollout": {"group_size": 2, "temprature": 1.0}}, ["rollout.temprature"]),
    ],
)
def test_unknown_key_error_names_the_key(raw, names):
    with pytest.raises(RecipeError) as e:
        recipe_from_dict(raw)
    for n in names:
        assert n in str(e.value)


@pytest.mark.parametrize(
    "key, value, expect",
    [
        ("train.max_steps", "ten", "expected an integer"),
        ("train.max_steps", 2.5, "expected an integer"),
        ("train.max_steps", True, "expected an integer"),
        ("model.autocast_bf16", "yes", "expected true/false"),
        ("algo.beta", "0.1", "expected float"),
        ("rewards.functions", "math_correct", "expected list"),
        ("data.limit", "8", "expected an integer"),
    ],
)
def test_wrong_type_names_key_and_value(key, value, expect):
    message = _error_setting(key, value)
    assert key in message and expect in message and repr(value) in message


def test_int_where_float_expected_is_accepted():
    r = recipe_from_dict({"algo": {"beta": 0}, "train": {"learning_rate": 1}})
    assert r.algo.beta == 0.0 and isinstance(r.algo.beta, float)
    assert isinstance(r.train.learning_rate, float)


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("rollout.group_size", 1, ">= 2"),
        ("rollout.group_size", 0, ">= 2"),
        ("rollout.max_new_tokens", 0, "> 0"),
        ("train.prompts_per_step", 0, "> 0"),
        ("train.max_steps", -1, "> 0"),
        ("train.micro_batch_size", 0, "> 0"),
        ("train.num_iterations", 0, "> 0"),
        ("data.max_prompt_tokens", 0, "> 0"),
        ("rewards.timeout_s", 0, "> 0"),
        ("algo.clip_eps_low", -0.1, ">= 0"),
        ("algo.clip_eps_high", -0.1, ">= 0"),
        ("algo.clip_eps_low", 1.0, "< 1"),
        ("algo.beta", -0.01, ">= 0"),
        ("algo.advantage_eps", -1e-4, ">= 0"),
        ("train.learning_rate", -1e-6, ">= 0"),
        ("rollout.temperature", 0.0, "> 0"),
        ("rollout.top_p", 0.0, "(0, 1]"),
        ("rollout.top_p", 1.5, "(0, 1]"),
        ("algo.kl_estimator", "k4", "k1, k2, k3"),
        ("algo.loss_aggregation", "sum", "token_mean"),
        ("rewards.on_error", "ignore", "raise, none"),
        ("train.save_total_limit", 0, ">= 1"),
    ],
)
def test_out_of_range_names_key_and_allowed(key, value, allowed):
    message = _error_setting(key, value)
    assert key in message and allowed in message


def test_weights_must_match_functions():
    with pytest.raises(RecipeError, match="rewards.weights"):
        recipe_from_dict({"rewards": {"functions": ["format"], "weights": [1.0, 2.0]}})


@pytest.mark.parametrize(
    "text, key, value",
    [
        ("train.max_steps=5", ["train", "max_steps"], 5),
        ("train.learning_rate=3e-6", ["train", "learning_rate"], 3e-6),
        ("algo.beta=0.5", ["algo", "beta"], 0.5),
        ("rewards.functions=[math_correct, format]", ["rewards", "functions"], ["math_correct", "format"]),
        ("rewards.weights=[1, 0.5]", ["rewards", "weights"], [1, 0.5]),
        ("data.limit=null", ["data", "limit"], None),
        ("data.limit=", ["data", "limit"], None),
        ("model.autocast_bf16=true", ["model", "autocast_bf16"], True),
        (
            "data.prompt_template={question} Answer: x=1",
            ["data", "prompt_template"],
            "{question} Answer: x=1",
        ),  # only the first '=' splits
    ],
)
def test_parse_override(text, key, value):
    assert parse_override(text) == (key, value)


@pytest.mark.parametrize("text", ["train.max_steps", "max_steps=3", "a.b.c=1", ".x=1"])
def test_bad_override_is_rejected(text):
    with pytest.raises(RecipeError):
        parse_override(text)


def test_load_recipe_applies_overrides(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("train:\n  max_steps: 7\nrollout:\n  group_size: 4\n")
    r = load_recipe(
        p,
        [
            "train.max_steps=3",
            "algo.beta=0",
            "data.limit=null",
            "rewards.functions=[format]",
            "train.adam_betas=[0.9, 0.95]",
        ],
    )
    assert r.train.max_steps == 3 and r.rollout.group_size == 4 and r.algo.beta == 0.0
    assert r.data.limit is None and r.rewards.functions == ["format"]
    assert r.train.adam_betas == [0.9, 0.95]
    with pytest.raises(RecipeError, match="train.max_stepz"):
        load_recipe(p, ["train.max_stepz=3"])


def test_load_recipe_file_errors(tmp_path):
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(RecipeError, match="mapping"):
        load_recipe(lst)


def test_help_text_lists_every_field_with_its_help():
    text = help_text()
    for sec in dataclasses.fields(Recipe):
        for f in dataclasses.fields(sec.type if isinstance(sec.type, type) else type(getattr(Recipe(), sec.name))):
            assert f"{sec.name}.{f.name} = " in text, f"{sec.name}.{f.name}"
            assert f.metadata["help"] in text


def test_to_dict_round_trips():
    r = recipe_from_dict({"train": {"max_steps": 3}, "rollout": {"group_size": 4}})
    assert recipe_from_dict(r.to_dict()) == r


def test_exponent_floats_without_a_dot(tmp_path):
    """PyYAML (YAML 1.1) reads ``1e-6`` as a string; recipes must read it as the float users mean."""
    p = tmp_path / "r.yaml"
    p.write_text("train:\n  learning_rate: 1e-6\nalgo:\n  advantage_eps: 1E-8\n")
    r = load_recipe(p, ["algo.beta=4e-2"])
    assert r.train.learning_rate == 1e-6 and r.algo.advantage_eps == 1e-8 and r.algo.beta == 0.04
    assert parse_override("data.system_prompt=e5")[1] == "e5"  # not a number: stays a string


@pytest.mark.parametrize(
    "text, value",
    [
        ("data.prompt_template={question}", "{question}"),  # YAML would read a mapping
        ("data.prompt_template={question} Answer: x=1", "{question} Answer: x=1"),  # YAML error
        ("data.system_prompt=42", "42"),
        ("data.system_prompt=null", None),
        ("data.dataset=data/train.jsonl", "data/train.jsonl"),
    ],
)
def test_text_fields_keep_the_literal_text(text, value):
    assert parse_override(text)[1] == value


def test_unparsable_value_of_a_non_text_field_is_a_recipe_error():
    with pytest.raises(RecipeError, match="rewards.functions"):
        parse_override("rewards.functions=[a, b")


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("train.max_consecutive_skips", 0, ">= 1"),
        ("train.sample_every", -1, ">= 0"),
        ("train.adam_betas", [0.9, 1.5], "[0, 1)"),
        ("train.adam_betas", [0.9], "two numbers"),
        ("data.limit", 0, "> 0 or null"),
        ("eval.limit", -5, "> 0 or null"),
        ("rollout.chunk_size", 0, "> 0 or null"),
        ("eval.max_new_tokens", 0, "> 0 or null"),
        ("rollout.top_k", -1, ">= 0"),
        ("rollout.min_p", 1.5, "[0, 1]"),
        ("data.prompt_template", "Solve this.", "no {question} field"),
        ("data.prompt_template", "{question} in {units}", "only the field {question}"),
        ("data.prompt_template", "{question} }", "only the field {question}"),
    ],
)
def test_more_out_of_range_values(key, value, allowed):
    message = _error_setting(key, value)
    assert key in message and allowed in message


def test_literal_braces_in_template_are_fine():
    r = recipe_from_dict({"data": {"prompt_template": "{question}\nPut it in \\boxed{{}}."}})
    assert "{{}}" in r.data.prompt_template


def test_load_recipe_not_utf8_names_file_line_offset(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_bytes(b"train:\r\n  max_steps: 3\r\ndata:\r\n  system_prompt: caf\xe9\r\n")
    # 3 lines of 8 + 16 + 7 bytes, then "  system_prompt: caf" (20 bytes)
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert str(e.value) == f"recipe {p}: line 4: not valid UTF-8 (byte 0xe9 at offset 51 of the file)"


def test_load_recipe_unreadable_and_bad_yaml_are_one_line_recipe_errors(tmp_path):
    with pytest.raises(RecipeError, match=r"recipe .*: cannot read"):
        load_recipe(tmp_path)  # a folder
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  max_steps: [1, 2\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(bad)
    assert str(e.value).startswith(f"recipe {bad}: not valid YAML: line 3, column 1: ")
    assert "\n" not in str(e.value)


def test_a_renamed_key_says_what_replaced_it():
    from grpokit.config import RecipeError, recipe_from_dict

    with pytest.raises(RecipeError, match=r"unknown recipe key model.fused_ops; it is now model.backend: auto"):
        recipe_from_dict({"model": {"fused_ops": True}})


# -- choices kept by the registries ---------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("rollout.engine", "sglang", "rollout.engine: 'sglang' is not one of hf, vllm"),
        ("rollout.sampler", "gumbel", "rollout.sampler: 'gumbel' is not one of inverse_cdf, multinomial"),
        ("algo.estimator", "a2c", "algo.estimator: 'a2c' is not one of grpo, ppo"),
        ("model.backend", "gpu", "model.backend: 'gpu' is not one of auto, cpu, plain"),
    ],
)
def test_a_bad_choice_names_the_key_and_the_registrys_names(key, value, message):
    assert _error_setting(key, value) == message


def test_registry_choices_have_one_source(monkeypatch):
    """``rollout.engine``, ``rollout.sampler``, ``algo.estimator`` and ``model.backend`` accept what
    the registries hold (grpokit.rollout.engine, grpokit.estimators.base, grpokit.backends), read when
    validating: a name registered there is a valid recipe value and shows in the help."""
    import grpokit.backends
    from grpokit.estimators.base import ALGORITHMS
    from grpokit.rollout.engine import ENGINES, SAMPLERS

    monkeypatch.setitem(ENGINES, "sglang", "somewhere:SGLangEngine")
    monkeypatch.setitem(ALGORITHMS, "ppo", object)
    monkeypatch.setattr(grpokit.backends, "NAMES", (*grpokit.backends.NAMES, "cuda_fast"))
    monkeypatch.setattr("grpokit.rollout.engine.SAMPLERS", (*SAMPLERS, "gumbel"))
    r = recipe_from_dict(
        {
            "rollout": {"engine": "sglang", "sampler": "gumbel"},
            "algo": {"estimator": "ppo"},
            "model": {"backend": "cuda_fast"},
        }
    )
    assert (r.rollout.engine, r.rollout.sampler, r.algo.estimator, r.model.backend) == (
        "sglang",
        "gumbel",
        "ppo",
        "cuda_fast",
    )
    text = help_text()
    for line in (
        "rollout.engine = 'hf' [hf | vllm | sglang]",
        "rollout.sampler = 'inverse_cdf' [inverse_cdf | multinomial | gumbel]",
        "algo.estimator = 'grpo' [grpo | ppo]",
        "model.backend = 'auto' [auto | cpu | plain | cuda_fast]",
    ):
        assert line in text, line


def test_importing_the_recipe_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, grpokit.config; assert not {'torch', 'transformers'} & set(sys.modules), sorted(sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_registry_listed_names_are_the_registries_names():
    # --help prints `listed` without importing the module; they must be what the module registers
    from grpokit.config import Registry
    from grpokit.config.schema import walk_recipe

    registries = [
        f.metadata["choices"] for _, _, f in walk_recipe(Recipe()) if isinstance(f.metadata.get("choices"), Registry)
    ]
    # backends, rollout engines, samplers, estimators; the loss catalog's sampler corrections,
    # surrogates, importance levels, aggregations, advantage scales and baselines
    assert len(registries) == 10
    for reg in registries:
        assert reg.listed == reg.names(), reg


def test_train_help_imports_no_torch():
    import subprocess
    import sys

    code = (
        "import sys; from grpokit.cli.main import main\n"
        "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "model.backend = 'auto' [auto | cpu | plain]" in out.stdout
    assert "algo.estimator = 'grpo' [grpo | ppo]" in out.stdout


# -- list keys: every element checked, named key[index] ---------------------------------------------


@pytest.mark.parametrize(
    "section, expect",
    [
        (
            {"functions": ["format", "math_correct"], "weights": [1, "x"]},
            "rewards.weights[1]: expected a number, got 'x'",
        ),
        (
            {"functions": ["format", "math_correct"], "weights": [float("nan"), 1]},
            "rewards.weights[0]: expected a finite number, got nan",
        ),
        (
            {"functions": ["format", "math_correct"], "weights": [1, float("-inf")]},
            "rewards.weights[1]: expected a finite number, got -inf",
        ),
        (
            {"functions": ["format", "math_correct"], "weights": [True, 1]},
            "rewards.weights[0]: expected a number, got True",
        ),
        ({"functions": [3, "format"]}, "rewards.functions[0]: expected a reward function name"),
        ({"functions": [None, "format"]}, "rewards.functions[0]: expected a reward function name"),
        ({"functions": ["format", ""]}, "rewards.functions[1]: expected a reward function name"),
        (
            {"functions": ["format", "math_correct", "format"], "weights": [1, 1, 0.5]},
            "rewards.functions[2]: 'format' is listed twice (also rewards.functions[0])",
        ),
    ],
)
def test_each_list_element_is_checked_by_key_and_index(section, expect):
    with pytest.raises(RecipeError) as e:
        recipe_from_dict({"rewards": section})
    assert str(e.value).startswith(expect), str(e.value)


@pytest.mark.parametrize(
    "raw, expect",
    [
        ({"train": {"adam_betas": [0.9, "x"]}}, "train.adam_betas[1]: expected a number, got 'x'"),
        ({"train": {"adam_betas": [True, 0.9]}}, "train.adam_betas[0]: expected a number, got True"),
        ({"train": {"adam_betas": [0.9, float("nan")]}}, "train.adam_betas[1]: expected a finite number"),
        ({"train": {"adam_betas": [0.9, 1.0]}}, "train.adam_betas[1]: expected a number in [0, 1), got 1.0"),
        (
            {"model": {"lora": {"target_modules": ["q_proj", 3]}}},
            "model.lora.target_modules[1]: expected a module name",
        ),
        (
            {"model": {"lora": {"target_modules": ["q_proj", "v_proj", "q_proj"]}}},
            "model.lora.target_modules[2]: 'q_proj' is listed twice (also model.lora.target_modules[0])",
        ),
    ],
)
def test_other_list_keys_check_each_element(raw, expect):
    with pytest.raises(RecipeError) as e:
        recipe_from_dict(raw)
    assert str(e.value).startswith(expect), str(e.value)


def test_every_list_key_of_the_schema_has_an_element_check():
    import typing

    from grpokit.config.checks import LIST_ELEMENTS
    from grpokit.config.schema import hints_of

    list_keys = set()
    for sec, cls in hints_of(Recipe).items():
        for name, hint in hints_of(cls).items():
            if list in (hint, typing.get_origin(hint), *typing.get_args(hint)):
                list_keys.add(f"{sec}.{name}")
    assert list_keys == set(LIST_ELEMENTS)


@pytest.mark.parametrize(
    "key, value",
    [
        ("train.learning_rate", float("nan")),
        ("algo.beta", float("nan")),
        ("rollout.temperature", float("inf")),
        ("train.max_grad_norm", float("inf")),
        ("rewards.timeout_s", float("nan")),
        ("algo.clip_eps_high", float("nan")),
    ],
)
def test_a_float_key_must_be_finite(key, value):
    """NaN passes every ``<``/``>`` range check, so it is refused before them."""
    assert _error_setting(key, value) == f"{key}: expected a finite number, got {value!r}"


def test_list_elements_from_overrides_are_checked_before_anything_loads():
    with pytest.raises(RecipeError, match=r"rewards\.functions\[0\]: expected a reward function name.*got 3"):
        load_recipe(None, ["rewards.functions=[3, format]"])
    with pytest.raises(RecipeError, match=r"rewards\.weights\[0\]: expected a finite number, got nan"):
        load_recipe(None, ["rewards.functions=[math_correct, format]", "rewards.weights=[.nan, 1]"])


# -- a key written twice in a recipe file -----------------------------------------------------------


@pytest.mark.parametrize(
    "text, expect",
    [
        (
            "train:\n  max_steps: 5\n  learning_rate: 1.0e-5\nrollout:\n  group_size: 4\ntrain:\n  max_steps: 20\n",
            "train is written twice (lines 1 and 6)",
        ),
        ("train:\n  max_steps: 5\n  seed: 1\n  max_steps: 20\n", "train.max_steps is written twice (lines 2 and 4)"),
        ("data:\n  options:\n    size: 10\n    size: 20\n", "data.options.size is written twice (lines 3 and 4)"),
        ("model:\n  lora: {r: 4, r: 8}\n", "model.lora.r is written twice (line 2, columns 10 and 16)"),
    ],
)
def test_a_key_written_twice_names_the_key_and_both_lines(tmp_path, text, expect):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert str(e.value) == f"recipe {p}: {expect}; each section and key may appear once"


def test_yaml_merge_keys_and_anchors_are_not_duplicates():
    from grpokit.config import DuplicateKeyError
    from grpokit.config.yaml_io import load_yaml

    assert load_yaml("a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n") == {"a": {"b": 1}, "c": {"b": 2}}
    assert load_yaml("a: {1: x, '1': y}") == {"a": {1: "x", "1": "y"}}  # an int and a string key differ
    with pytest.raises(DuplicateKeyError, match=r"a\[1\]\.k is written twice"):
        load_yaml("a: [{k: 1}, {k: 1, k: 2}]")
    with pytest.raises(RecipeError, match="data.options=.*: value is not valid YAML: k is written twice"):
        parse_override("data.options={k: 1, k: 2}")


@pytest.mark.parametrize("name", packaged_recipes())
def test_every_packaged_recipe_loads_and_its_sft_section_is_complete(name):
    from grpokit.cli.recipe_args import find_recipe
    from grpokit.cli.sft import sft_job

    path = find_recipe(name)
    recipe = load_recipe(path)
    if recipe.sft.model is not None:  # `grpokit sft RECIPE` can run it: model, data and template set
        job = sft_job([str(path)])
        assert job.out == recipe.model.name_or_path and job.recipe.sft.completion_template


def test_a_recipe_files_errors_start_with_its_file_and_line(tmp_path):
    """Unknown keys at any depth and wrong values, as read by load_recipe (the Python API, grpokit
    eval/sft/prm and train alike): ``<file>:<line>: <message>``; a value an override set: no line."""
    from grpokit.config.loading import key_lines

    path = tmp_path / "r.yaml"
    text = "model:\n  name_or_path: m\n  lora:\n    r: 4\n    rr: 2\ntrain:\n  max_steps: abc\n"
    assert key_lines(text) == {
        "model": 1,
        "model.name_or_path": 2,
        "model.lora": 3,
        "model.lora.r": 4,
        "model.lora.rr": 5,
        "train": 6,
        "train.max_steps": 7,
    }
    path.write_text(text)
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(path))}:7: train\.max_steps: expected an integer"):
        load_recipe(path)
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(path))}:5: unknown recipe key model\.lora\.rr; "):
        load_recipe(path, ["train.max_steps=3"])
    path.write_text(text.replace("    rr: 2\n", ""))
    with pytest.raises(RecipeError, match=r"^train\.max_steps: expected an integer, got 'x'$"):
        load_recipe(path, ["train.max_steps=x"])  # the command line's value, not the file's
