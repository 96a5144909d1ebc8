"""Trackers (``train.report_to``, issue #34 part 3): each writes the names, values and steps of
``metrics.jsonl`` into the run folder, read back here from its own offline files (TensorBoard's
events, wandb's ``.wandb`` log, mlflow's SQLite store, trackio's database); a tracker that raises
is dropped with one warning while the run goes on; a missing package is an ImportError naming its
extra; a name that is not a tracker is a RecipeError.

wandb, mlflow and trackio are in the ``test`` extra (``make setup`` installs them).
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from grpokit.config import RecipeError, recipe_from_dict
from grpokit.metrics import RunLogger, RunWarning, read_metrics
from grpokit.trackers import TensorBoardTracker, check_trackers, mlflow_key, tracker_names

ROOT = Path(__file__).resolve().parents[1]

#: three metrics.jsonl lines of a fake run: names of every kind (eval/, rewards/ with a spec mlflow
#: refuses), and values the trackers must leave out (None, NaN, inf, text)
LINES = [
    {"step": 1, "reward_mean": 0.5, "loss": 0.25, "eval/accuracy": 0.75, "kl": None, "lr": float("nan")},
    {"step": 2, "reward_mean": 0.625, "loss": -0.125, "rewards/http://h:1/s": 1.0, "note": "x", "skipped_updates": 0},
    {"step": 3, "reward_mean": 0.75, "loss": float("inf"), "eval/accuracy": 0.5},
]
#: what every tracker must hold: name -> [(step, value)]
EXPECTED = {
    "reward_mean": [(1, 0.5), (2, 0.625), (3, 0.75)],
    "loss": [(1, 0.25), (2, -0.125)],
    "eval/accuracy": [(1, 0.75), (3, 0.5)],
    "rewards/http://h:1/s": [(2, 1.0)],
    "skipped_updates": [(2, 0.0)],
}
SAMPLES = [{"prompt": "1+1", "completion": "2", "reward": 1.0, "turns": [{"by": "model", "text": "2"}]}]
CONFIG = {"train": {"learning_rate": 1e-6, "report_to": ["x"]}, "model": {"name_or_path": "tiny"}}


def _fake_run(out: Path, report_to, *, lines=LINES, resume_step: int = 0, image: Path | None = None) -> None:
    """A RunLogger's life in a run: (resume or start), the lines, samples at step 2, the image, close."""
    logger = RunLogger(out, report_to=report_to, config=CONFIG)
    logger.truncate_after(resume_step)
    for line in lines:
        logger.log(line)
        if line["step"] == 2:
            logger.log_samples(2, SAMPLES)
    if image is not None:
        logger.log_image("curves", image)
    logger.close()


def _png(path: Path) -> Path:
    """A 4x4 PNG (what curves.png stands for)."""
    from PIL import Image

    Image.new("RGB", (4, 4), (255, 0, 0)).save(path)
    return path


def _series(by_step: dict[int, dict[str, float]]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(by_step):
        for k, v in by_step[step].items():
            out.setdefault(k, []).append((step, v))
    return out


# ---- names ---------------------------------------------------------------------------------------


def test_tracker_names_takes_a_name_a_list_or_none():
    assert tracker_names("wandb") == ["wandb"]
    assert tracker_names("none") == tracker_names(["none"]) == tracker_names([]) == tracker_names(None) == []
    assert tracker_names(["tensorboard", "mlflow", "trackio"]) == ["tensorboard", "mlflow", "trackio"]
    with pytest.raises(ValueError, match=r"^train\.report_to\[1\]: 'comet' is not a tracker; expected one of "):
        tracker_names(["wandb", "comet"])
    with pytest.raises(ValueError, match=r"'all' is not a tracker.*list the trackers instead"):
        tracker_names("all")
    with pytest.raises(ValueError, match=r"\[1\]: 'wandb' is listed twice \(also train\.report_to\[0\]\)"):
        tracker_names(["wandb", "wandb"])
    with pytest.raises(ValueError, match=r"none \(no tracker\) cannot be listed with trackers"):
        tracker_names(["wandb", "none"])


def test_recipe_key_report_to_defaults_to_tensorboard_takes_a_string_and_refuses_other_names():
    assert recipe_from_dict({}).train.report_to == ["tensorboard"]  # today's behaviour
    assert recipe_from_dict({"train": {"report_to": "wandb"}}).train.report_to == ["wandb"]
    assert recipe_from_dict({"train": {"report_to": "none"}}).train.report_to == []
    assert recipe_from_dict({"train": {"report_to": ["mlflow", "trackio"]}}).to_dict()["train"]["report_to"] == [
        "mlflow",
        "trackio",
    ]
    with pytest.raises(RecipeError, match=r"^train\.report_to\[0\]: 'neptune' is not a tracker; expected one of "):
        recipe_from_dict({"train": {"report_to": ["neptune"]}})
    with pytest.raises(RecipeError, match=r"tensorboard, wandb, mlflow, trackio"):
        recipe_from_dict({"train": {"report_to": "comet"}})
    with pytest.raises(RecipeError, match=r"^train\.report_to: expected list"):
        recipe_from_dict({"train": {"report_to": 3}})


def test_report_to_may_change_on_resume():
    from grpokit.config.resume import check_resume

    old = recipe_from_dict({}).to_dict()
    changes = check_resume(old, recipe_from_dict({"train": {"report_to": ["wandb"]}}), "ckpt")
    assert changes == [("train.report_to", ["tensorboard"], ["wandb"])]


def test_mlflow_key_keeps_accepted_names_and_maps_refused_ones_to_accepted_ones():
    from mlflow.utils.validation import _validate_metric_name

    for name in ["reward_mean", "eval/accuracy", "rewards/mod:f", "env/turns", "a b-c.d"]:
        assert mlflow_key(name) == name
    for name in ["rewards/http://h:1/s", "rewards/./r.py:f", "rewards/~/r.py:f(x)", "/a/", "a/../b", "é?"]:
        _validate_metric_name(mlflow_key(name))  # raises MlflowException for a refused name
        with pytest.raises(Exception, match="Invalid value"):
            _validate_metric_name(name)
    assert len(mlflow_key("x" * 300)) == 250  # the store's limit on a key


# ---- each tracker, read back from its files ------------------------------------------------------


def test_tensorboard_writes_the_metric_names_values_and_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fake_run(tmp_path, ["tensorboard"], image=_png(tmp_path / "curves.png"))
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    got = {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]}
    assert got == {k: [(s, pytest.approx(v)) for s, v in pts] for k, pts in EXPECTED.items()}
    assert acc.Tags()["images"] == ["curves"] and acc.Images("curves")[0].step == 3


def test_tensorboard_on_resume_hides_the_steps_logged_after_the_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fake_run(tmp_path, ["tensorboard"])  # steps 1-3 logged, the checkpoint was at step 2
    again = {"step": 3, "reward_mean": 0.0}
    _fake_run(tmp_path, ["tensorboard"], lines=[again], resume_step=2)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(1, 0.5), (2, 0.625), (3, 0.0)]


def _wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` file: wandb's LevelDB-style log (a 7-byte header ``:W&B``, magic,
    version; 32 KiB blocks of chunks, each ``crc32 (4) | length (2) | type (1)``, type 1 whole, 2 first,
    3 middle, 4 last) of ``wandb_internal_pb2.Record`` messages. wandb >= 0.20 reads it in Go only."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", data[:7]
    records, pos, buf = [], 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        buf = (b"" if kind in (1, 2) else buf) + data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
    return records


def _wandb_files(run_dir: Path, runs: int) -> list[list]:
    """The records of the ``runs`` offline run folders of ``run_dir``, oldest first, once each file
    ends with its ``exit`` record: offline, ``run.finish()`` returns before wandb-core has written
    everything (it finishes the file some milliseconds later)."""
    deadline = time.monotonic() + 20
    while True:
        files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        records = [_wandb_records(f) for f in files]
        if len(files) >= runs and all(r and r[-1].WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"wandb did not finish {files} ({[len(r) for r in records]} records)"
        time.sleep(0.1)


def _wandb_history(run_dir: Path, runs: int = 1) -> tuple[dict[int, dict[str, object]], dict, list[str]]:
    """``({step: {name: value}}, config, run ids)`` over the ``runs`` offline run folders of ``run_dir``."""
    history: dict[int, dict[str, object]] = {}
    config: dict = {}
    ids = []
    for records in _wandb_files(run_dir, runs):
        for rec in records:
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.append(rec.run.run_id)
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "history":
                row: dict[str, object] = {}
                for i in rec.history.item:  # a media value (table, image) comes as nested keys
                    *parents, last = [i.key] if i.key else list(i.nested_key)
                    at = row
                    for p in parents:
                        at = at.setdefault(p, {})
                    at[last] = json.loads(i.value_json)
                step = row.pop("_step")
                history.setdefault(step, {}).update({k: v for k, v in row.items() if not k.startswith("_")})
    return history, config, ids


@pytest.fixture
def wandb_env(monkeypatch):
    """wandb with no account, no console capture and nothing from the environment."""
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")


@pytest.mark.slow
def test_wandb_writes_an_offline_run_with_the_metric_names_values_and_steps(tmp_path, wandb_env):
    _fake_run(tmp_path, ["wandb"], image=_png(tmp_path / "curves.png"))
    history, config, ids = _wandb_history(tmp_path)
    numbers = {s: {k: v for k, v in row.items() if not isinstance(v, dict)} for s, row in history.items()}
    assert _series(numbers) == EXPECTED
    assert history[2]["samples"]["_type"] == "table-file" and history[3]["curves"]["_type"] == "image-file"
    assert config["train"] == CONFIG["train"] and config["model"] == CONFIG["model"]
    assert json.loads((tmp_path / "tracker_runs.json").read_text()) == {"wandb": ids[0]}


def test_wandb_resumed_run_continues_the_same_run_id_a_fresh_one_does_not(tmp_path, wandb_env):
    _fake_run(tmp_path, ["wandb"], lines=LINES[:2])
    _fake_run(tmp_path, ["wandb"], lines=LINES[2:], resume_step=2)
    history, _, ids = _wandb_history(tmp_path, runs=2)
    assert len(ids) == 2 and ids[0] == ids[1]  # two offline folders of one run (wandb sync joins them)
    assert [s for s, _ in _series(history)["reward_mean"]] == [1, 2, 3]
    _fake_run(tmp_path, ["wandb"], lines=LINES[:1])  # train.resume=none in the same folder: a new run
    assert json.loads((tmp_path / "tracker_runs.json").read_text())["wandb"] != ids[0]


def _mlflow_client(run_dir: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")


@pytest.fixture
def mlflow_env(monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.slow
def test_mlflow_writes_a_local_store_with_the_metric_names_values_and_steps(tmp_path, mlflow_env):
    _fake_run(tmp_path, ["mlflow"], image=_png(tmp_path / "curves.png"))
    client = _mlflow_client(tmp_path)
    run = client.get_run(json.loads((tmp_path / "tracker_runs.json").read_text())["mlflow"])
    names = json.loads(Path(client.download_artifacts(run.info.run_id, "metric_names.json", str(tmp_path))).read_text())
    assert names == {"rewards/http:/h:1/s": "rewards/http://h:1/s"}  # the one name mlflow refuses, mapped back
    got = {
        names.get(key, key): [
            (m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        ]
        for key in run.data.metrics
    }
    assert got == EXPECTED
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    assert run.data.params["train.learning_rate"] == "1e-06"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "recipe.json", "samples", "metric_names.json"} <= artifacts
    assert str(tmp_path.resolve() / "mlartifacts") in run.info.artifact_uri
    table = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert table == ["samples/step_000002.json"]


@pytest.mark.slow
def test_mlflow_resumed_run_continues_the_same_run(tmp_path, mlflow_env):
    _fake_run(tmp_path, ["mlflow"], lines=LINES[:2])
    first = json.loads((tmp_path / "tracker_runs.json").read_text())["mlflow"]
    _fake_run(tmp_path, ["mlflow"], lines=LINES[2:], resume_step=2)
    client = _mlflow_client(tmp_path)
    assert json.loads((tmp_path / "tracker_runs.json").read_text())["mlflow"] == first
    assert [m.step for m in client.get_metric_history(first, "reward_mean")] == [1, 2, 3]
    assert client.get_run(first).info.status == "FINISHED"


def test_trackio_writes_its_store_in_the_run_folder_with_the_metric_names_values_and_steps(tmp_path, monkeypatch):
    import importlib.util

    assert importlib.util.find_spec("trackio"), "trackio missing: make setup installs the test extra"
    # (found, not imported: importing it fixes its folder)
    first_import = "trackio" not in sys.modules
    if first_import:  # this run's folder becomes trackio's
        monkeypatch.delenv("TRACKIO_DIR", raising=False)
    _fake_run(tmp_path, ["trackio"], image=_png(tmp_path / "curves.png"))
    import trackio.utils
    from trackio.sqlite_storage import SQLiteStorage

    if first_import:
        assert Path(trackio.utils.TRACKIO_DIR) == tmp_path.resolve() / "trackio"
        assert (tmp_path / "trackio" / "grpokit.db").is_file()
    name = json.loads((tmp_path / "tracker_runs.json").read_text())["trackio"]
    assert name == tmp_path.name
    rows = SQLiteStorage.get_logs("grpokit", name)  # a row per log call: a step's metrics, its table, ...
    numbers: dict[int, dict[str, float]] = {}
    for r in rows:
        numbers.setdefault(r["step"], {}).update(
            {k: v for k, v in r.items() if isinstance(v, (int, float)) and k != "step"}
        )
    assert _series(numbers) == EXPECTED
    assert any(isinstance(r.get("samples"), dict) for r in rows) and any("curves" in r for r in rows)


def test_trackio_resumed_run_continues_the_run_of_that_name(tmp_path):
    import importlib.util

    assert importlib.util.find_spec("trackio"), "trackio missing: make setup installs the test extra"
    _fake_run(tmp_path, ["trackio"], lines=LINES[:2])
    _fake_run(tmp_path, ["trackio"], lines=LINES[2:], resume_step=2)
    from trackio.sqlite_storage import SQLiteStorage

    runs = [r for r in SQLiteStorage.get_runs("grpokit") if r == tmp_path.name]
    assert len(runs) == 1  # one run, not one per part
    steps = [r["step"] for r in SQLiteStorage.get_logs("grpokit", tmp_path.name) if "reward_mean" in r]
    assert steps == [1, 2, 3]


# ---- failures ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tracker_that_raises_is_warned_about_once_and_dropped_while_the_run_goes_on(
    tmp_path, monkeypatch, mlflow_env
):
    calls = []

    def broken(self, metrics, step):
        calls.append(step)
        raise ConnectionError("server gone")

    monkeypatch.setattr(TensorBoardTracker, "log", broken)
    with pytest.warns(RunWarning) as record:
        _fake_run(tmp_path, ["tensorboard", "mlflow"])
    said = [str(w.message) for w in record if issubclass(w.category, RunWarning)]
    assert len(said) == 1, said  # the second and third lines say nothing more
    assert "tracker tensorboard raised ConnectionError: server gone (in log)" in said[0]
    assert calls == [1]  # dropped after its first failure
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    run_id = json.loads((tmp_path / "tracker_runs.json").read_text())["mlflow"]
    assert [m.step for m in _mlflow_client(tmp_path).get_metric_history(run_id, "reward_mean")] == [1, 2, 3]


def test_a_tracker_that_fails_to_start_is_dropped_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(TensorBoardTracker, "start", lambda self, **kw: 1 / 0)
    with pytest.warns(RunWarning, match=r"tracker tensorboard raised ZeroDivisionError.*\(in start\)") as record:
        _fake_run(tmp_path, ["tensorboard"])
    assert sum(issubclass(w.category, RunWarning) for w in record) == 1
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3


def _block(monkeypatch, *names: str) -> None:
    """Make ``import name`` (and of its submodules already loaded) raise ImportError."""
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    "name, module, package",
    [("wandb", "wandb", "wandb"), ("mlflow", "mlflow", "mlflow-skinny"), ("trackio", "trackio", "trackio")],
)
def test_a_missing_tracker_package_is_an_import_error_naming_its_extra(tmp_path, monkeypatch, name, module, package):
    _block(monkeypatch, module)
    expect = rf"^train\.report_to=\[{name}\] needs {package}, which is not installed: pip install 'grpokit\[{name}\]'$"
    with pytest.raises(ImportError, match=expect):
        check_trackers(["tensorboard", name])
    with pytest.raises(ImportError, match=expect):
        RunLogger(tmp_path, report_to=[name])
    assert not (tmp_path / "metrics.jsonl").exists()


def test_mlflow_local_store_without_sqlalchemy_names_the_extra(monkeypatch, mlflow_env):
    _block(monkeypatch, "sqlalchemy")
    with pytest.raises(ImportError, match=r"mlflow.db\) needs sqlalchemy.*pip install 'grpokit\[mlflow\]'"):
        check_trackers("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # a server: no local store
    check_trackers("mlflow")


def test_build_run_names_the_missing_extra_before_any_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    import grpokit.models.loading
    from grpokit.trainer.build import build_run
    from support.helpers import tiny_recipe

    def no_model(*a, **k):
        raise AssertionError("a model or tokenizer was loaded before the tracker check")

    monkeypatch.setattr(grpokit.models.loading, "load_tokenizer", no_model)
    _block(monkeypatch, "wandb")
    with pytest.raises(ImportError, match=r"pip install 'grpokit\[wandb\]'"):
        build_run(tiny_recipe(tiny_model_dir, tmp_path, train={"report_to": ["wandb"]}))


def test_the_default_tensorboard_missing_still_only_warns(tmp_path, monkeypatch):
    import grpokit.utils.importing
    from grpokit.utils.importing import MissingExtraWarning

    monkeypatch.setattr(grpokit.utils.importing, "_warned", set())
    _block(monkeypatch, "tensorboard")
    check_trackers(["tensorboard"])  # nothing to say before the run
    with pytest.warns(MissingExtraWarning, match=r"grpokit\[tensorboard\]'; writing metrics\.jsonl only"):
        _fake_run(tmp_path, None)
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3


@pytest.mark.slow
def test_the_trackers_module_imports_no_tracker_library_and_no_torch():
    code = (
        "import sys, grpokit.trackers, grpokit.metrics, grpokit.config\n"
        "assert not {'torch', 'wandb', 'mlflow', 'trackio', 'tensorboard'} & set(sys.modules), sorted(sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


# ---- through the training loop -------------------------------------------------------------------


@pytest.mark.slow
def test_a_tiny_training_run_reports_to_wandb_offline(tiny_model_dir, tmp_path, wandb_env):
    import grpokit.trainer.build
    from grpokit.trainer.loop import train
    from support.helpers import tiny_recipe

    recipe = tiny_recipe(tiny_model_dir, tmp_path, train={"max_steps": 2, "report_to": "wandb", "sample_every": 1})
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        train(recipe, progress=False, run=grpokit.trainer.build.build_run(recipe))
    assert not [w for w in said if "tracker" in str(w.message)]  # wandb did not fail
    history, config, ids = _wandb_history(tmp_path)
    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(history) == [1, 2] and len(ids) == 1
    for line in lines:
        row = history[line["step"]]
        for k, v in line.items():
            if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                assert row[k] == pytest.approx(v), k
        assert row["samples"]["_type"] == "table-file"
    if (tmp_path / "curves.png").exists():
        assert history[2]["curves"]["_type"] == "image-file"
    assert config["train"]["report_to"] == ["wandb"]
    assert not (tmp_path / "tensorboard").exists()
