"""Optional dependencies (issue 15, item 8): ``pyproject.toml`` states ranges; what only some runs
need is an extra, imported only where it is used; a missing one raises an ``ImportError`` naming
the extra, or, for the plot and the TensorBoard mirror, warns once and lets the run finish.

A package's absence is simulated with ``sys.modules[name] = None`` (``import name`` then raises
``ImportError``), or, for the import check of every module, a blocking import hook in a fresh
interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import grpokit.utils.importing
from grpokit.utils.importing import MissingExtraWarning, require
from support.helpers import tiny_recipe, tiny_recipe_dict, write_recipe

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = {  # extra -> the modules it installs (as imported)
    "reasoning-gym": ["reasoning_gym"],
    "torchao": ["torchao"],
    "plots": ["matplotlib"],
    "tensorboard": ["tensorboard"],
    "datasets": ["datasets", "pyarrow"],
    "lora": ["peft"],
}
TRACKERS = {"wandb": ["wandb"], "mlflow": ["mlflow", "sqlalchemy"], "trackio": ["trackio"]}  # train.report_to
OPTIONAL = [m for mods in (*EXTRAS.values(), *TRACKERS.values()) for m in mods] + ["pandas", "peft", "vllm"]


def _block(monkeypatch, *names: str) -> None:
    """Make ``import name`` (and of any submodule already loaded) raise ImportError."""
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test sees the once-per-process warnings afresh."""
    monkeypatch.setattr(grpokit.utils.importing, "_warned", set())


# ---- pyproject.toml ------------------------------------------------------------------------------


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(req: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(req).name.lower().replace("_", "-")


def test_core_dependencies_are_ranges_without_the_optional_packages():
    from packaging.requirements import Requirement

    deps = _project()["dependencies"]
    pinned = [d for d in deps if "==" in d or "~=" in d]
    assert not pinned, f"exact pins in [project] dependencies (they belong in requirements/lock.txt): {pinned}"
    for d in deps:
        spec = Requirement(d).specifier
        assert any(s.operator == ">=" for s in spec), f"{d}: no lower bound"
    names = {_name(d) for d in deps}
    assert {"torch", "transformers", "math-verify", "pyyaml", "safetensors"} <= names
    optional = {"reasoning-gym", "torchao", "matplotlib", "tensorboard", "datasets", "pyarrow", "peft", "vllm"}
    optional |= {"wandb", "mlflow-skinny", "trackio"}
    assert not names & optional, names & optional


def test_each_optional_package_is_an_extra_and_all_and_test_hold_them():
    extras = _project()["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = {_name(r) for r in extras[extra]}
        assert names >= {m.replace("_", "-") for m in modules}, (extra, names)
        assert not any("==" in r for r in extras[extra]), extras[extra]
    assert extras["all"] == [f"grpokit[{','.join(EXTRAS)}]"]
    assert "grpokit[all]" in extras["test"]  # the tests exercise every extra
    assert f"grpokit[{','.join(TRACKERS)}]" in extras["test"]  # and read every tracker's files back


def test_lock_pins_every_package_exactly():
    lock = ROOT / "requirements" / "lock.txt"
    lines = [l for l in lock.read_text().splitlines() if l and not l.startswith("#")]
    assert all("==" in l and "+" not in l for l in lines), [l for l in lines if "==" not in l or "+" in l]
    pinned = {l.split("==")[0].lower().replace("_", "-") for l in lines}
    assert {
        "torch",
        "transformers",
        "reasoning-gym",
        "torchao",
        "matplotlib",
        "tensorboard",
        "datasets",
        "peft",
    } <= pinned
    assert "-c requirements/lock.txt" in (ROOT / "Makefile").read_text().replace("$(LOCK)", "requirements/lock.txt")


# ---- no optional package at import time ----------------------------------------------------------

_IMPORT_ALL = """
import importlib, importlib.abc, pkgutil, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Block())
import grpokit
names = sorted(m.name for m in pkgutil.walk_packages(grpokit.__path__, "grpokit.") if not m.name.endswith("__main__"))
for name in names:
    importlib.import_module(name)
print(len(names), "modules")
"""


@pytest.mark.slow
def test_every_module_imports_without_the_optional_packages():
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, ",".join(OPTIONAL)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[0]) > 30


# ---- the helper ----------------------------------------------------------------------------------


def test_require_names_the_extra_and_the_failing_import(monkeypatch):
    assert require("json", extra="x", why="y") is json
    _block(monkeypatch, "torchao")
    with pytest.raises(
        ImportError,
        match=r"^the thing needs torchao, which is not installed: "
        r"pip install 'grpokit\[torchao\]'$",
    ) as e:
        require("torchao.optim", extra="torchao", why="the thing")
    assert isinstance(e.value.__cause__, ImportError)


def test_require_says_what_failed_when_the_package_is_there_but_broken(monkeypatch, tmp_path):
    (tmp_path / "grpokit_broken_pkg").mkdir()
    (tmp_path / "grpokit_broken_pkg" / "__init__.py").write_text("import grpokit_missing_dep_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ImportError,
        match=r"^w needs broken, which is not installed: pip install 'grpokit\[e\]' "
        r"\(importing grpokit_broken_pkg failed: No module named "
        r"'grpokit_missing_dep_xyz'\)$",
    ):
        require("grpokit_broken_pkg", extra="e", why="w", package="broken")


# ---- each optional package -----------------------------------------------------------------------


def test_adamw_8bit_without_torchao_names_the_extra(monkeypatch):
    from grpokit.config import recipe_from_dict
    from grpokit.trainer.optim import make_optimizer

    _block(monkeypatch, "torchao")
    recipe = recipe_from_dict({"train": {"optimizer": "adamw_8bit"}})
    with pytest.raises(
        ImportError, match=r"train\.optimizer=adamw_8bit needs torchao.*pip install 'grpokit\[torchao\]'"
    ):
        make_optimizer(torch.nn.Linear(4, 4), recipe.train)
    make_optimizer(torch.nn.Linear(4, 4), recipe_from_dict({}).train)  # the default needs nothing


@pytest.mark.slow
def test_grpokit_init_only_quiets_torchao_it_does_not_import_it():
    code = "import sys, grpokit; assert not {'torchao', 'torch', 'transformers'} & set(sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


def test_reasoning_gym_data_reward_and_scorer_without_the_package(monkeypatch):
    from grpokit.data import load_rows
    from grpokit.data.reasoning_gym import _scorer, reasoning_gym_score
    from grpokit.rewards import get_reward_function

    _block(monkeypatch, "reasoning_gym")
    _scorer.cache_clear()
    hint = r"pip install 'grpokit\[reasoning-gym\]'"
    with pytest.raises(ImportError, match=rf"dataset 'reasoning_gym:basic_arithmetic' needs reasoning-gym.*{hint}"):
        load_rows("reasoning_gym:basic_arithmetic", limit=2)
    with pytest.raises(ImportError, match=rf"reward 'reasoning_gym' needs reasoning-gym.*{hint}"):
        get_reward_function("reasoning_gym")
    entry = {"question": "1+1", "answer": "2", "metadata": {"source_dataset": "basic_arithmetic"}}
    with pytest.raises(ImportError, match=hint):
        reasoning_gym_score(["p"], ["<answer>2</answer>"], rg_entry=[entry], rg_task=["basic_arithmetic"])
    _scorer.cache_clear()


def test_train_cli_without_reasoning_gym_is_one_line_naming_the_extra(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from grpokit.cli.main import main

    _block(monkeypatch, "reasoning_gym")
    raw = tiny_recipe_dict(
        tiny_model_dir, tmp_path / "out", data={"dataset": "reasoning_gym:basic_arithmetic", "split": "train"}
    )
    assert main(["train", str(write_recipe(tmp_path / "r.yaml", raw)), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("grpokit train: error: ") and "pip install 'grpokit[reasoning-gym]'" in err[-1], err


def test_hub_and_parquet_data_without_datasets_name_the_extra(monkeypatch, tmp_path):
    from grpokit.data import load_rows

    _block(monkeypatch, "datasets", "pyarrow", "pandas")
    with pytest.raises(ImportError, match=r"'hf-only/name'.*needs datasets.*pip install 'grpokit\[datasets\]'"):
        load_rows("hf:hf-only/name", "train")
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ImportError, match=r"needs pyarrow or pandas.*pip install 'grpokit\[datasets\]'"):
        load_rows(str(tmp_path / "d.parquet"))


def test_plot_without_matplotlib_warns_once_and_draws_nothing(monkeypatch, tmp_path):
    from grpokit.metrics.curves import plot_curves

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    _block(monkeypatch, "matplotlib")
    with pytest.warns(MissingExtraWarning, match=r"curves\.png needs matplotlib.*pip install 'grpokit\[plots\]'"):
        assert plot_curves(metrics, tmp_path / "curves.png") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second plot says nothing more
        assert plot_curves(metrics, tmp_path / "curves.png") is False
    assert not (tmp_path / "curves.png").exists()


def test_run_logger_without_tensorboard_writes_jsonl_and_says_so_once(monkeypatch, tmp_path):
    from grpokit.metrics import RunLogger, read_metrics

    _block(monkeypatch, "tensorboard")
    with pytest.warns(
        MissingExtraWarning,
        match=r"TensorBoard.*needs tensorboard.*pip install "
        r"'grpokit\[tensorboard\]'; writing metrics\.jsonl only",
    ):
        logger = RunLogger(tmp_path)
    logger.log({"step": 1, "loss": 0.25})
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 0.25}]
    assert not (tmp_path / "tensorboard").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RunLogger(tmp_path / "again").close()  # once per process
        RunLogger(tmp_path / "off", tensorboard=False).close()  # not asked for: nothing to say


@pytest.mark.curves
@pytest.mark.slow
def test_run_without_plots_and_tensorboard_finishes_with_metrics(tiny_model_dir, tmp_path, monkeypatch):
    import grpokit.trainer.build
    from grpokit.metrics import read_metrics
    from grpokit.trainer.loop import train

    _block(monkeypatch, "matplotlib", "tensorboard")
    recipe = tiny_recipe(tiny_model_dir, tmp_path, train={"max_steps": 1})
    with pytest.warns(MissingExtraWarning) as record:
        summary = train(recipe, progress=False, run=grpokit.trainer.build.build_run(recipe))
    said = sorted(str(w.message) for w in record if issubclass(w.category, MissingExtraWarning))
    assert len(said) == 2 and "grpokit[plots]" in said[0] and "grpokit[tensorboard]" in said[1], said
    assert summary["last_metrics"]["step"] == 1
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [1]
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "checkpoint-1").is_dir()
    assert not (tmp_path / "curves.png").exists() and not (tmp_path / "tensorboard").exists()
