"""``curves.png`` shows what a run did, one panel per question a user asks of it.

- **Reward functions**: each ``rewards/<name>`` per step (thin) and smoothed (thick); under process
  supervision also the mean step score (``step_reward_mean``).
- **Held-out accuracy**: each evaluation the run wrote (the one before training at step 0, the
  periodic ones, the one after training at the last step) with its 95 % interval; the tick under
  each point gives the training minutes at that step.
- **Fractions**: completions cut at the token limit, and groups with zero reward variance (no
  learning signal).
- **Entropy** (nats per token) and **completion length** (tokens).
- **Loss**, **gradient norm** (before clipping) and **learning rate** of each step's update, when
  the metrics have them (every ``metrics.jsonl`` line does).
- **KL to the reference** only when β > 0, **clip fractions** only when μ > 1: at β = 0 no KL is
  computed, and at μ = 1 the ratio is 1 at every token, so those panels could not move.

:func:`curve_panels` decides what is drawn (no plotting library; tests read it);
:func:`plot_curves` draws it (:func:`draw_panels`) with matplotlib (the optional extra
``grpokit[plots]``; without it a run warns once and leaves curves.png out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpokit.metrics import read_metrics
from grpokit.utils.importing import require, warn_missing

SMOOTHING = 0.8
"""Weight of the past in :func:`smooth` (TensorBoard's default is 0.6; runs here are short and noisy)."""


def smooth(values: list[float | None], weight: float = SMOOTHING) -> list[float]:
    """Exponential moving average with bias correction, as TensorBoard draws it.

    ``m_t = w·m_{t-1} + (1-w)·x_t`` from ``m_0 = 0``, shown as ``m_t / (1 - w^n_t)`` where ``n_t``
    counts the finite values so far. ``None``/NaN values are skipped (their point is NaN and the
    average carries on).

    >>> [round(v, 4) for v in smooth([1.0, 0.0, None], 0.5)]
    [1.0, 0.3333, nan]

    Raises:
        ValueError: ``weight`` outside [0, 1).
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smooth: weight must be in [0, 1), got {weight}")
    out, m, n = [], 0.0, 0
    for x in values:
        if x is None or not math.isfinite(x):
            out.append(float("nan"))
            continue
        n += 1
        m = weight * m + (1.0 - weight) * x
        out.append(m / (1.0 - weight**n))
    return out


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float | None]]:
    return [r["step"] for r in rows], [r.get(key) for r in rows]


def _raw(rows: list[dict], key: str, label: str) -> dict[str, Any]:
    x, y = _series(rows, key)
    return {"label": label, "x": x, "y": y, "kind": "raw"}


def _raw_and_smoothed(rows: list[dict], key: str, label: str, smoothed_label: str | None = None) -> list[dict]:
    """Two lines of ``key``: per step (``raw``) and :func:`smooth`-ed (``smooth``; labelled
    ``smoothed_label``, default ``"<label> (smoothed)"``)."""
    raw = _raw(rows, key, label)
    return [
        raw,
        {"label": smoothed_label or f"{label} (smoothed)", "x": raw["x"], "y": smooth(raw["y"]), "kind": "smooth"},
    ]


def _table(evaluation: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """An evaluation's ``{metric: {"value", "lo", "hi"}}`` (the ``metrics.metrics`` table of what
    ``eval_<when>.json`` holds); {} for None."""
    return ((evaluation or {}).get("metrics") or {}).get("metrics") or {}


def _eval_points(
    rows: list[dict], before: Mapping[str, Any] | None, after: Mapping[str, Any] | None = None
) -> dict[str, dict[str, list]]:
    """``{metric: {"x", "y", "lo", "hi", "minutes"}}`` from the ``eval/<metric>`` keys, with the
    before-training evaluation (``eval_before.json``) at step 0 and the after-training one
    (``eval_after.json``) at the last step of ``rows`` (0 without rows), unless a periodic
    evaluation of that step is there already (then the one after training is that one)."""
    pts: dict[str, dict[str, list]] = {}

    def add(metric: str, step: int, minutes: float, v: float, lo: float, hi: float) -> None:
        p = pts.setdefault(metric, {"x": [], "y": [], "lo": [], "hi": [], "minutes": []})
        for k, val in zip(("x", "y", "lo", "hi", "minutes"), (step, v, lo, hi, minutes)):
            p[k].append(val)

    for name, m in _table(before).items():
        add(name, 0, 0.0, m["value"], m["lo"], m["hi"])
    for r in rows:
        for k in r:
            if k.startswith("eval/") and not k.endswith(("_lo", "_hi")):
                name = k[len("eval/") :]
                add(name, r["step"], r.get("train_minutes", float("nan")), r[k], r[f"{k}_lo"], r[f"{k}_hi"])
    step, minutes = (int(rows[-1]["step"]), rows[-1].get("train_minutes", float("nan"))) if rows else (0, 0.0)
    for name, m in _table(after).items():
        if step not in pts.get(name, {}).get("x", []):
            add(name, step, minutes, m["value"], m["lo"], m["hi"])
    return pts


def _update_panels(rows: list[dict]) -> list[dict[str, Any]]:
    """The loss, gradient-norm and learning-rate panels, each when some row has its metric."""
    panels = []
    for key, title, ylabel in (("loss", "loss", "loss"), ("grad_norm", "gradient norm", "L2 norm, before clipping")):
        if any(r.get(key) is not None for r in rows):
            panels.append({"title": title, "ylabel": ylabel, "lines": _raw_and_smoothed(rows, key, key)})
    if any(r.get("lr") is not None for r in rows):
        panels.append({"title": "learning rate", "ylabel": "lr", "lines": [_raw(rows, "lr", "lr")]})
    return panels


def curve_panels(
    rows: list[dict[str, Any]],
    *,
    beta: float,
    num_iterations: int,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The panels of ``curves.png`` (module docstring), as data.

    Args:
        rows: ``metrics.jsonl`` lines (dicts with ``step``).
        beta: the run's KL coefficient β (``algo.beta``); 0 drops the KL panel.
        num_iterations: μ (``train.num_iterations``); 1 drops the clip-fraction panel.
        before: the before-training evaluation (the dict in ``eval_before.json``, as
            :meth:`grpokit.eval.evaluate.HeldOutEval.run` returns it), or None.
        after: the after-training evaluation (``eval_after.json``), drawn at the last step, or None.

    Returns:
        A list of ``{"title", "ylabel", "lines"}``; each line is ``{"label", "x", "y", "kind"}``
        with ``kind`` one of ``raw``, ``smooth``, ``interval`` (then also ``lo``, ``hi``,
        ``minutes``).
    """
    panels = []
    lines = []
    for key in sorted({k for r in rows for k in r if k.startswith("rewards/")}):
        lines += _raw_and_smoothed(rows, key, key[len("rewards/") :])
    if any(r.get("step_reward_mean") is not None for r in rows):  # process supervision: the step scores
        lines += _raw_and_smoothed(rows, "step_reward_mean", "step reward (process)", "step reward (process, smoothed)")
    if lines:
        panels.append({"title": "reward functions", "ylabel": "mean reward", "lines": lines})
    evals = _eval_points(rows, before, after)
    if evals:
        panels.append(
            {
                "title": "held-out accuracy (95 % interval)",
                "ylabel": "accuracy",
                "lines": [{"label": name, "kind": "interval", **p} for name, p in evals.items()],
            }
        )
    fractions = [
        _raw(rows, "truncated_frac", "truncated (hit max_new_tokens)"),
        _raw(rows, "frac_zero_std", "groups with zero reward variance"),
    ]
    if any(r.get("step_frac_zero_std") is not None for r in rows):  # process supervision's own signal
        fractions.append(_raw(rows, "step_frac_zero_std", "groups with zero step-reward variance"))
    panels.append({"title": "fractions", "ylabel": "fraction", "lines": fractions})
    for key, title, ylabel in (
        ("entropy", "entropy", "nats / token"),
        ("completion_len_mean", "completion length", "tokens"),
    ):
        panels.append({"title": title, "ylabel": ylabel, "lines": _raw_and_smoothed(rows, key, key)})
    panels += _update_panels(rows)
    if beta > 0:
        panels.append(
            {"title": "KL to the reference (k3)", "ylabel": "nats / token", "lines": [_raw(rows, "kl", "kl")]}
        )
    if num_iterations > 1:
        panels.append(
            {
                "title": "clip fraction",
                "ylabel": "fraction of tokens",
                "lines": [_raw(rows, k, k) for k in ("clip_frac_low", "clip_frac_high")],
            }
        )
    return panels


def _nan(y: list) -> list[float]:
    return [float("nan") if v is None else v for v in y]


def plot_curves(
    metrics_path: str | Path,
    out_png: str | Path,
    *,
    beta: float = 0.0,
    num_iterations: int = 1,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> bool:
    """Draw :func:`curve_panels` of ``metrics_path`` into ``out_png`` (two rows of panels);
    ``before``/``after``: the evaluations before and after training, as :func:`curve_panels` takes them.

    matplotlib is the optional extra ``grpokit[plots]``: without it nothing is drawn and a
    :class:`~grpokit.utils.importing.MissingExtraWarning` naming the extra is given (once), so that a run
    ends with its metrics.jsonl and without curves.png instead of failing at the end.

    Returns:
        Whether ``out_png`` was written.

    Raises:
        FileNotFoundError / ValueError: as :func:`grpokit.metrics.read_metrics`.
    """
    try:
        matplotlib = require("matplotlib", extra="plots", why="curves.png")
    except ImportError as e:
        warn_missing(e, f"{out_png} is not drawn (metrics.jsonl holds the numbers)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    fig = draw_panels(curve_panels(rows, beta=beta, num_iterations=num_iterations, before=before, after=after))
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return True


def draw_panels(panels: list[dict[str, Any]]) -> Any:
    """A matplotlib figure of :func:`curve_panels`' ``panels`` (two rows), not saved or closed.

    Steps are whole numbers, so the step axis has integer ticks only (``MaxNLocator(integer=True)``;
    the held-out panel ticks its evaluation steps). Every line keeps its label in the legend, one
    starting with ``_`` too (a reward function ``_private``; matplotlib would hide such a label if
    the legend collected the labels itself)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ncol = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(2, ncol, figsize=(4.6 * ncol, 7.0), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        handles, labels = [], []
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for i, ln in enumerate(panel["lines"]):
            color = f"C{i // 2}" if panel["lines"][-1]["kind"] == "smooth" else f"C{i}"
            if ln["kind"] == "interval":
                y = ln["y"]
                err = [[v - lo for v, lo in zip(y, ln["lo"])], [hi - v for v, hi in zip(y, ln["hi"])]]
                drawn = ax.errorbar(ln["x"], y, yerr=err, marker="o", capsize=3, color=color)
                if i == 0:
                    ax.set_xticks(ln["x"], [f"{s}\n{m:.0f} min" for s, m in zip(ln["x"], ln["minutes"])])
            elif ln["kind"] == "smooth":
                (drawn,) = ax.plot(ln["x"], _nan(ln["y"]), color=color, linewidth=2.0)
            else:
                (drawn,) = ax.plot(
                    ln["x"],
                    _nan(ln["y"]),
                    color=color,
                    linewidth=0.8,
                    alpha=0.45 if panel["lines"][-1]["kind"] == "smooth" else 1.0,
                )
            handles.append(drawn)
            labels.append(ln["label"])
        ax.set_title(panel["title"])
        ax.set_xlabel("step")
        ax.set_ylabel(panel["ylabel"])
        if len(panel["lines"]) > 1:
            ax.legend(handles, labels, fontsize=7)  # explicit labels: none dropped for a leading "_"
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig
