"""Experiment trackers: where a run's metrics go besides ``metrics.jsonl`` (``train.report_to``).

``train.report_to`` (TRL's name) lists trackers by name (:data:`TRACKERS`): ``tensorboard`` (the
default), ``wandb``, ``mlflow``, ``trackio``; ``none`` or ``[]`` for ``metrics.jsonl`` alone, which is
always written. Each tracker is its library, an optional extra of the same name, imported only when
the recipe names it. Every one writes into the run folder unless its own environment variables point
elsewhere, and nothing leaves the machine by default:

- ``tensorboard`` (extra ``tensorboard``): ``<output_dir>/tensorboard/`` events.
- ``wandb`` (extra ``wandb``): ``<output_dir>/wandb/offline-run-*`` (``mode="offline"``; upload later
  with ``wandb sync``); when ``WANDB_MODE`` or ``WANDB_API_KEY`` is set, wandb's own mode (online
  with a key). ``WANDB_DIR`` and ``WANDB_PROJECT`` are obeyed.
- ``mlflow`` (extra ``mlflow``: mlflow-skinny, sqlalchemy, alembic): the SQLite store
  ``<output_dir>/mlflow.db`` and artifacts in ``<output_dir>/mlartifacts/`` (MLflow 3 refuses its
  old file store ``mlruns/`` unless told to allow it); ``MLFLOW_TRACKING_URI`` (a server, another
  store) and ``MLFLOW_EXPERIMENT_NAME`` are obeyed.
- ``trackio`` (extra ``trackio``): ``<output_dir>/trackio/grpokit.db`` (``TRACKIO_DIR=<output_dir>/trackio
  trackio show`` shows it). trackio reads its folder, ``TRACKIO_DIR``, once per process, when it is
  first imported: a set ``TRACKIO_DIR`` is obeyed, and in a process that trains several runs the
  first decides where all go.

What each receives (:class:`Tracker`): the recipe (``Recipe.to_dict()``) as the run's config at
the start; each ``metrics.jsonl`` line's numbers under the same names (``reward_mean``, ``loss``,
``eval/accuracy``, ``rewards/<name>``, ...) at its ``step`` (:func:`scalars`: ``None``, NaN, ±inf and
non-numbers left out, booleans as 0/1); the ``samples.jsonl`` lines of a step as a table named
``samples``; ``curves.png`` as an image named ``curves`` at the end. The project is ``grpokit``
and the run's name its folder's name.

Departures, each a limit of a library:

- **mlflow names**: MLflow accepts metric names of letters, digits, ``_ - . / :`` and spaces that do
  not read as another path (``a//b``, ``./a``); a name it would refuse (a reward spec such as
  ``rewards/http://host/score``) is logged under :func:`mlflow_key`'s name (each refused character
  ``_``, empty and dot segments dropped or escaped, a ``_2`` suffix against a collision), and the run's
  artifact ``metric_names.json`` maps each such MLflow name back to its ``metrics.jsonl`` name.
  The recipe is logged flat as params (``train.learning_rate``) and whole as ``recipe.json``.
- **resume** (a run continued from a checkpoint, ``train.resume``): the tracker run continues where
  the library allows it cheaply. ``<output_dir>/tracker_runs.json`` keeps each tracker's run id:
  wandb resumes that id (``resume="allow"``; offline, a second ``offline-run-*`` folder with the
  same id, which ``wandb sync`` uploads into the one run), mlflow reopens that run (its params are
  not logged again: MLflow refuses changed values; changes on resume are in
  ``trainer_state.json``), trackio reopens the run of that name (``resume="allow"``), TensorBoard
  writes a new events file with ``purge_step`` so that the steps after the checkpoint, logged
  before the run stopped, are dropped from view. Steps logged before the stop and logged again
  after the resume: wandb online keeps the first value (it drops steps below the run's last one,
  with a warning of its own), mlflow and trackio keep both. A fresh run (``train.resume=none``, or
  no checkpoint) starts new tracker runs.

Failures (:class:`grpokit.metrics.RunLogger` applies them):

- a named tracker whose package is missing: ``ImportError`` naming the extra (``pip install
  'grpokit[wandb]'``), raised by :func:`check_trackers` before any model loads; except
  ``tensorboard``, the default, which warns once and is left out (as before ``train.report_to``);
- a tracker that raises while the run goes on (at its start, which is at the first line logged,
  or in any call): one :class:`grpokit.metrics.RunWarning` naming it and the error, then that
  tracker is dropped; the run, ``metrics.jsonl`` and the other trackers go on.

Imports the standard library only (each tracker's library when it starts; TensorBoard's writer
imports torch).
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from grpokit.utils.importing import require

__all__ = [
    "NAMES",
    "TRACKERS",
    "Tracker",
    "check_trackers",
    "mlflow_key",
    "scalars",
    "tracker_names",
]

PROJECT = "grpokit"
"""The project (wandb, trackio) or experiment (mlflow) a run is logged under."""

RUN_IDS = "tracker_runs.json"
"""``<output_dir>/tracker_runs.json``: tracker name -> its run id, read when a run resumes."""

KEY = "train.report_to"


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of a ``metrics.jsonl`` line that trackers get, under the same names: finite
    ints and floats (booleans as 0/1); ``step``, ``None``, NaN, ±inf and non-numbers left out.

    >>> scalars({"step": 3, "loss": 0.5, "kl": None, "lr": float("nan"), "eval/acc": 1, "x": "a"})
    {'loss': 0.5, 'eval/acc': 1.0}
    """
    return {k: float(v) for k, v in metrics.items() if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


def _table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """``rows`` as ``(columns, data)``: the union of their keys in first-seen order; values that are
    not ``str``/number/bool/None (a multi-turn row's ``turns``) as JSON text."""
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]

    def cell(v: Any) -> Any:
        return v if v is None or isinstance(v, (str, int, float, bool)) else json.dumps(v)

    return columns, [[cell(r.get(c)) for c in columns] for r in rows]


def _stored_id(run_dir: Path, name: str) -> str | None:
    """The run id ``name`` stored in ``<run_dir>/tracker_runs.json`` (None: none, or unreadable)."""
    try:
        value = json.loads((run_dir / RUN_IDS).read_text()).get(name)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _store_id(run_dir: Path, name: str, run_id: str) -> None:
    """Record ``run_id`` as tracker ``name``'s in ``<run_dir>/tracker_runs.json`` (atomically)."""
    path = run_dir / RUN_IDS
    try:
        ids = json.loads(path.read_text())
        ids = ids if isinstance(ids, dict) else {}
    except (OSError, ValueError):
        ids = {}
    ids[name] = run_id
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(ids, indent=1) + "\n")
    os.replace(tmp, path)


class Tracker(Protocol):
    """One tracker (module docstring). ``name`` and ``extra`` name it and the ``grpokit`` extra that
    installs its library; :meth:`require` imports that library (``ImportError`` naming the extra).
    :class:`grpokit.metrics.RunLogger` calls :meth:`start` once, before the first of the others;
    a method that raises drops the tracker (with one warning)."""

    name: str
    extra: str

    def require(self) -> None: ...

    def start(self, *, config: dict[str, Any], run_dir: Path, run_name: str, resume_step: int) -> None:
        """Open the tracker's run: ``config`` the recipe, ``run_dir`` the run folder, ``resume_step``
        the checkpoint's step when the run resumes (0: a fresh run)."""
        ...

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_image(self, name: str, path: Path, step: int) -> None: ...

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None: ...

    def finish(self) -> None: ...


def _why(name: str) -> str:
    return f"{KEY}=[{name}]"


class TensorBoardTracker:
    """``<run_dir>/tensorboard/`` events through ``torch.utils.tensorboard`` (scalars and the image;
    no tables)."""

    name = extra = "tensorboard"

    def __init__(self) -> None:
        self._writer: Any = None

    def require(self) -> None:
        require("tensorboard", extra=self.extra, why="the TensorBoard mirror of the metrics")

    def start(self, *, config: dict[str, Any], run_dir: Path, run_name: str, resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides the earlier files' events from that step on (logged before a stop)
        self._writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def log_image(self, name: str, path: Path, step: int) -> None:
        import numpy as np
        from PIL import Image

        self._writer.add_image(name, np.asarray(Image.open(path).convert("RGB")), step, dataformats="HWC")
        self._writer.flush()

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        """Nothing: TensorBoard has no tables (``samples.jsonl`` has them)."""

    def finish(self) -> None:
        self._writer.close()


class WandbTracker:
    """A Weights & Biases run, offline in ``<run_dir>/wandb/`` unless ``WANDB_MODE`` or
    ``WANDB_API_KEY`` is set (module docstring)."""

    name = extra = "wandb"

    def __init__(self) -> None:
        self._run: Any = None
        self._wandb: Any = None

    def require(self) -> None:
        self._wandb = require("wandb", extra=self.extra, why=_why(self.name))

    def start(self, *, config: dict[str, Any], run_dir: Path, run_name: str, resume_step: int) -> None:
        wandb = self._wandb
        chosen = "WANDB_MODE" in os.environ or "WANDB_API_KEY" in os.environ
        run_id = _stored_id(run_dir, self.name) if resume_step else None
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            name=run_name,
            dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
            mode=None if chosen else "offline",
            id=run_id,
            resume="allow" if run_id else None,
        )
        self._run.config.update(config, allow_val_change=True)  # changed keys on resume
        _store_id(run_dir, self.name, self._run.id)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def log_image(self, name: str, path: Path, step: int) -> None:
        self._run.log({name: self._wandb.Image(str(path))}, step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        columns, data = _table(rows)
        self._run.log({name: self._wandb.Table(columns=columns, data=data)}, step=step)

    def finish(self) -> None:
        self._run.finish()


#: what MLflow accepts in a metric or param name (its ``validate_param_and_metric_name``; no ``:`` on Windows)
_MLFLOW_CHAR = re.compile(r"[/\w.\- ]" if os.name == "nt" else r"[/\w.\- :]")
_MLFLOW_MAX_KEY = 250


def mlflow_key(name: str) -> str:
    """``name`` as MLflow accepts it: itself when MLflow would take it, else each character it refuses
    as ``_``, empty segments (``a//b``, a leading or trailing ``/``) dropped, ``.`` and ``..``
    segments prefixed with ``_``, and cut at MLflow's 250 characters.

    >>> mlflow_key("eval/accuracy"), mlflow_key("rewards/./my.py:f"), mlflow_key("rewards/http://h:1/s")
    ('eval/accuracy', 'rewards/_./my.py:f', 'rewards/http:/h:1/s')
    >>> mlflow_key("rewards/~/r.py:f(x)")
    'rewards/_/r.py:f_x_'
    """
    chars = "".join(c if _MLFLOW_CHAR.fullmatch(c) else "_" for c in name)
    parts = [f"_{p}" if p in (".", "..") else p for p in chars.split("/") if p]
    key = "/".join(parts)[:_MLFLOW_MAX_KEY].rstrip("/") or "_"
    return key if posixpath.normpath(key) == key else "_" + key.replace("/", "_")[: _MLFLOW_MAX_KEY - 1]


def _flat(config: dict[str, Any]) -> dict[str, str]:
    """``{"section.key": str(value)}`` of a recipe's nested dicts, each value cut at MLflow's 6000 characters."""
    return {
        mlflow_key(f"{sec}.{k}"): (v if isinstance(v, str) else json.dumps(v, default=str))[:6000]
        for sec, values in config.items()
        if isinstance(values, dict)
        for k, v in values.items()
    }


class MlflowTracker:
    """An MLflow run in the SQLite store ``<run_dir>/mlflow.db`` (artifacts in ``<run_dir>/mlartifacts/``)
    unless ``MLFLOW_TRACKING_URI`` is set (module docstring). Through ``MlflowClient``: no
    process-wide active run or tracking URI is set."""

    name = extra = "mlflow"

    def __init__(self) -> None:
        self._client: Any = None
        self._run_id = ""
        self._keys: dict[str, str] = {}  # metrics.jsonl name -> its mlflow name
        self._names: dict[str, str] = {}  # mlflow name -> metrics.jsonl name, for the names changed

    def require(self) -> None:
        require("mlflow", extra=self.extra, why=_why(self.name), package="mlflow-skinny")
        if not os.environ.get("MLFLOW_TRACKING_URI"):  # the local SQLite store
            for module in ("sqlalchemy", "alembic"):
                require(module, extra=self.extra, why=f"{_why(self.name)} (its local store <output_dir>/mlflow.db)")

    def start(self, *, config: dict[str, Any], run_dir: Path, run_name: str, resume_step: int) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self._client = client = MlflowClient(tracking_uri=uri or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        found = client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            where = None if uri else (run_dir / "mlartifacts").resolve().as_uri()
            experiment_id = client.create_experiment(experiment, artifact_location=where)
        run_id = _stored_id(run_dir, self.name) if resume_step else None
        if run_id is not None:
            try:
                client.update_run(run_id, status="RUNNING")
            except Exception:  # noqa: BLE001 - not in this store (MLFLOW_TRACKING_URI changed): a new run
                run_id = None
        if run_id is None:
            run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
            params = [Param(k, v) for k, v in _flat(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per call
                client.log_batch(run_id, params=params[i : i + 100])
        self._run_id = run_id
        client.log_dict(run_id, config, "recipe.json")
        _store_id(run_dir, self.name, run_id)

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now, batch, changed = int(time.time() * 1000), [], False
        for k, v in metrics.items():
            key = self._keys.get(k)
            if key is None:  # a new name: its mlflow name, unique among this run's
                key = base = mlflow_key(k)
                taken, n = set(self._keys.values()), 1
                while key in taken:
                    n += 1
                    key = f"{base[: _MLFLOW_MAX_KEY - 6]}_{n}"
                self._keys[k] = key
                if key != k:
                    self._names[key], changed = k, True
            batch.append(Metric(key, v, now, step))
        self._client.log_batch(self._run_id, metrics=batch)
        if changed:
            self._client.log_dict(self._run_id, self._names, "metric_names.json")

    def log_image(self, name: str, path: Path, step: int) -> None:
        self._client.log_artifact(self._run_id, str(path))

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        columns, data = _table(rows)
        self._client.log_dict(self._run_id, {"columns": columns, "data": data}, f"{name}/step_{step:06d}.json")

    def finish(self) -> None:
        self._client.set_terminated(self._run_id, "FINISHED")


class TrackioTracker:
    """A trackio run in ``<run_dir>/trackio/grpokit.db`` unless ``TRACKIO_DIR`` is set (module
    docstring); trackio's own CPU/GPU sampling is off (grpokit logs its own timings)."""

    name = extra = "trackio"

    def __init__(self) -> None:
        self._run: Any = None
        self._trackio: Any = None

    def require(self) -> None:
        import importlib.util

        # not imported yet: only found (importing it fixes its folder, which start() chooses)
        if "trackio" in sys.modules or importlib.util.find_spec("trackio") is None:
            require("trackio", extra=self.extra, why=_why(self.name))

    def start(self, *, config: dict[str, Any], run_dir: Path, run_name: str, resume_step: int) -> None:
        if "trackio" not in sys.modules and not os.environ.get("TRACKIO_DIR"):
            os.environ["TRACKIO_DIR"] = str(run_dir.resolve() / "trackio")  # read once, at import
            try:
                self._trackio = require("trackio", extra=self.extra, why=_why(self.name))
            finally:
                del os.environ["TRACKIO_DIR"]
        else:
            self._trackio = require("trackio", extra=self.extra, why=_why(self.name))
        stored = _stored_id(run_dir, self.name) if resume_step else None
        self._run = self._trackio.init(
            project=PROJECT,
            name=stored or run_name,
            config=config,
            resume="allow" if stored else "never",
            auto_log_cpu=False,
            auto_log_gpu=False,
            embed=False,
        )
        _store_id(run_dir, self.name, self._run.name)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def log_image(self, name: str, path: Path, step: int) -> None:
        self._run.log({name: self._trackio.Image(str(path))}, step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        columns, data = _table(rows)
        self._run.log({name: self._trackio.Table(columns=columns, data=data)}, step=step)

    def finish(self) -> None:
        self._run.finish()


#: tracker name -> its class (the names ``train.report_to`` accepts)
TRACKERS: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
    "trackio": TrackioTracker,
}
NAMES = tuple(TRACKERS)


def tracker_names(value: Sequence[str] | str | None, key: str = KEY) -> list[str]:
    """``train.report_to`` as a list of tracker names: a name (``"wandb"``) or a list of them;
    ``"none"``, ``["none"]``, ``None`` and ``[]`` are no tracker.

    >>> tracker_names("wandb"), tracker_names("none"), tracker_names(["tensorboard", "mlflow"])
    (['wandb'], [], ['tensorboard', 'mlflow'])

    Raises:
        ValueError: a name not in :data:`TRACKERS` (``all`` included: list them), one listed twice,
            or ``none`` beside another; the message starts with ``key`` and lists the names.
    """
    if value is None:
        return []
    names = [value] if isinstance(value, str) else list(value)
    if names == ["none"]:
        return []
    allowed = f"one of {', '.join(NAMES)}, or none (metrics.jsonl alone)"
    for i, name in enumerate(names):
        at = key if isinstance(value, str) else f"{key}[{i}]"
        if name == "none":
            raise ValueError(f"{at}: none (no tracker) cannot be listed with trackers {names}")
        if not isinstance(name, str) or name not in TRACKERS:
            hint = "; list the trackers instead, e.g. [tensorboard, wandb]" if name == "all" else ""
            raise ValueError(f"{at}: {name!r} is not a tracker; expected {allowed}{hint}")
        if name in names[:i]:
            raise ValueError(f"{at}: {name!r} is listed twice (also {key}[{names.index(name)}]); list each once")
    return names


def check_trackers(value: Sequence[str] | str | None) -> None:
    """Check, before any model loads, that the library of every tracker ``value`` names can be
    imported (:meth:`Tracker.require`), except ``tensorboard``'s: the default, it warns and is left
    out when missing (:class:`grpokit.metrics.RunLogger`).

    Raises:
        ValueError: as :func:`tracker_names`.
        ImportError: a tracker's package is missing; the message names the extra
            (``train.report_to=[wandb] needs wandb, which is not installed: pip install 'grpokit[wandb]'``).
    """
    for name in tracker_names(value):
        if name != "tensorboard":
            TRACKERS[name]().require()
