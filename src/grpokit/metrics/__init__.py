"""Run outputs: metrics.jsonl, samples.jsonl, and the same sent to the run's trackers
(TensorBoard events by default; wandb, mlflow, trackio: :mod:`grpokit.trackers`, ``train.report_to``);
the step warnings (:class:`RunWarning`). ``curves.png``: :mod:`grpokit.metrics.curves`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.trackers import TRACKERS, Tracker, scalars, tracker_names
from grpokit.utils.importing import warn_missing
from grpokit.utils.textio import NotUtf8Error, read_utf8

if TYPE_CHECKING:
    import torch


#: the keys every metrics.jsonl line carries (the public contract; tests check them).
METRIC_KEYS = (
    "step",
    "reward_mean",
    "reward_std",
    "frac_zero_std",
    "loss",
    "kl",
    "clip_frac_low",
    "clip_frac_high",
    "entropy",
    "completion_len_mean",
    "truncated_frac",
    "grad_norm",
    "lr",
    "step_s",
    "gen_s",
    "train_s",
    "tokens_per_s",
    "threads",
    # reliability: unscorable rewards, reward rows that raised/timed out, updates skipped as non-finite
    "unscorable_frac",
    "reward_failures",
    "skipped_updates",
)


class RunWarning(UserWarning):
    """A step (or an evaluation) that trained on, or measured, little or nothing
    (:func:`warn_if_step_did_nothing`); or a tracker that raised and was dropped (:class:`RunLogger`)."""


@contextlib.contextmanager
def plain_warnings(*, own_output: bool = False) -> Iterator[None]:
    """While inside, a :class:`RunWarning` (or a missing optional extra's warning) is shown as one
    ``[grpokit] warning: ...`` line on stderr instead of Python's file, line and source line; other
    warnings as before. :meth:`grpokit.Trainer.train` runs inside it: only the text is changed
    (``warnings.formatwarning``), so filters and ``catch_warnings(record=True)`` see the warnings as
    ever. ``own_output`` (``grpokit train``, which owns its process): such a warning is printed
    whatever else captures warnings (``warnings.showwarning`` replaced too)."""
    from grpokit.utils.importing import MissingExtraWarning

    fmt, show = warnings.formatwarning, warnings.showwarning

    def ours(category: type[Warning]) -> bool:
        return issubclass(category, (RunWarning, MissingExtraWarning))

    def plain(message: Warning | str, category: type[Warning], *a: Any, **k: Any) -> str:
        return f"[grpokit] warning: {message}\n" if ours(category) else fmt(message, category, *a, **k)

    def say(message: Warning | str, category: type[Warning], *a: Any, **k: Any) -> None:
        if ours(category):
            print(plain(message, category), end="", file=sys.stderr, flush=True)
        else:
            show(message, category, *a, **k)

    warnings.formatwarning = plain
    if own_output:
        warnings.showwarning = say
    try:
        yield
    finally:
        warnings.formatwarning, warnings.showwarning = fmt, show


#: warn when at least this fraction of the completions was cut at the new-token limit
TRUNCATED_WARN_FRAC = 0.5


def _step_of(line: str) -> int | None:
    """The ``step`` of a JSON line, or None for a blank or torn (half-written) line."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


class NullLogger:
    """The logger of a rank other than 0 in a data-parallel run: the same methods, no files."""

    def __init__(self, output_dir: str | Path):
        self.dir = Path(output_dir)
        self.metrics_path = self.dir / "metrics.jsonl"  # rank 0's file (read after the run)
        self.samples_path = self.dir / "samples.jsonl"

    def truncate_after(self, step: int) -> None:
        """Nothing (rank 0 truncates)."""

    def log(self, metrics: dict) -> None:
        """Nothing (rank 0 logs)."""

    def log_samples(self, step: int, samples: list) -> None:
        """Nothing (rank 0 logs)."""

    def log_image(self, name: str, path: str | Path) -> None:
        """Nothing (rank 0 logs)."""

    def close(self) -> None:
        """Nothing to close."""


class RunLogger:
    """Appends one JSON line per step to ``metrics.jsonl`` (and the sampled completions to
    ``samples.jsonl``) and sends the same to the run's trackers (:mod:`grpokit.trackers`).

    Args:
        output_dir: the run folder (made if missing).
        report_to: tracker names, as ``train.report_to`` takes them (None: ``["tensorboard"]``).
        config: the run's config for the trackers (``Recipe.to_dict()``).
        tensorboard: False leaves ``tensorboard`` out of ``report_to``.

    The trackers start at the first line logged, after :meth:`truncate_after` has said whether the
    run resumes (their run continues then, :mod:`grpokit.trackers`). A tracker that raises, at its
    start or later, is dropped with one :class:`RunWarning` naming it and the error; the files and
    the other trackers go on. TensorBoard is the optional extra ``grpokit[tensorboard]``: without it
    a :class:`~grpokit.utils.importing.MissingExtraWarning` naming the extra is given once and it is
    left out.

    Raises:
        ValueError: a name that is not a tracker (:func:`grpokit.trackers.tracker_names`).
        ImportError: a tracker other than ``tensorboard`` whose package is missing; the message names
            the extra (``pip install 'grpokit[wandb]'``).
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        report_to: list[str] | str | None = None,
        config: dict[str, Any] | None = None,
        tensorboard: bool = True,
    ):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        names = tracker_names(["tensorboard"] if report_to is None else report_to)
        names = [n for n in names if tensorboard or n != "tensorboard"]
        self._trackers: list[Tracker] = []
        for name in names:
            tracker = TRACKERS[name]()
            try:
                tracker.require()
            except ImportError as e:
                if name != "tensorboard":
                    raise
                # tensorboard not installed: the other files (as before train.report_to)
                alone = (
                    f"writing {self.metrics_path.name} only" if names == ["tensorboard"] else "no TensorBoard events"
                )
                warn_missing(e, alone)
                continue
            self._trackers.append(tracker)
        self._config = config or {}
        self._resume_step = 0
        self._started = False
        self._step = 0  # the last step logged (an image is logged at it)

    def truncate_after(self, step: int) -> None:
        """Drop lines of steps > ``step`` (a resumed run rewrites them), and a line torn by a kill
        mid-write. The file is replaced atomically. ``step > 0`` also tells the trackers that the
        run resumes from there; 0 that it is a fresh run.

        Raises:
            ValueError: on resume (``step > 0``), ``metrics.jsonl`` or ``samples.jsonl`` holds bytes
                that are not UTF-8 (the files are written as ASCII, so this is damage, not a torn
                line): the one-line message names the file, line and byte offset; the file is left
                as it is. A fresh run (``step = 0``) keeps no line, so it just empties such a file.
        """
        for path in (self.metrics_path, self.samples_path):
            if path.exists():
                try:
                    text = read_utf8(path)
                except NotUtf8Error as e:
                    if step > 0:
                        raise ValueError(f"{e}; repair or remove it to resume in {self.dir}") from None
                    text = ""  # steps start at 1: a fresh run keeps nothing of an earlier run
                steps = [(l, _step_of(l)) for l in text.splitlines()]
                keep = [l for l, st in steps if st is not None and st <= step]
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text("".join(l + "\n" for l in keep))
                os.replace(tmp, path)
        self._resume_step = self._step = step

    def _each(self, what: str, call: Any) -> None:
        """``call(tracker)`` for each tracker, started first; one that raises is dropped (warned once)."""
        if not self._started and self._trackers:
            self._started = True
            name = self.dir.resolve().name
            for t in list(self._trackers):
                self._guard(
                    t,
                    "start",
                    lambda t: t.start(
                        config=self._config, run_dir=self.dir, run_name=name, resume_step=self._resume_step
                    ),
                )
        for t in list(self._trackers):
            self._guard(t, what, call)

    def _guard(self, tracker: Tracker, what: str, call: Any) -> None:
        try:
            call(tracker)
        except Exception as e:  # noqa: BLE001 - a tracker's fault never stops the run
            self._trackers.remove(tracker)
            warnings.warn(
                f"tracker {tracker.name} raised {type(e).__name__}: {e} (in {what}); it is dropped and the "
                f"run goes on without it ({self.metrics_path} has every step)",
                RunWarning,
                stacklevel=4,
            )
            if what != "finish":
                try:
                    tracker.finish()
                except Exception:  # noqa: BLE001 - closing what is left of it, best effort
                    pass

    def log(self, metrics: dict[str, Any]) -> None:
        """Append ``metrics`` (a dict with ``step``) to ``metrics.jsonl`` (non-finite floats as null)
        and send its numbers to the trackers (:func:`grpokit.trackers.scalars`)."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        self._step = step = metrics["step"]
        numbers = scalars(metrics)
        self._each("log", lambda t: t.log(numbers, step))

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """Append ``samples`` (:func:`sample_lines`) to ``samples.jsonl`` with their ``step`` and send
        them to the trackers as the table ``samples`` (those that take tables)."""
        with self.samples_path.open("a") as f:
            for s in samples:
                f.write(json.dumps({"step": step, **s}) + "\n")
        self._each("log_table", lambda t: t.log_table("samples", samples, step))

    def log_image(self, name: str, path: str | Path) -> None:
        """Send the image file ``path`` (``curves.png``) to the trackers as ``name``, at the last
        step logged; nothing when the file is not there (no matplotlib)."""
        image = Path(path)
        if image.is_file():
            self._each("log_image", lambda t: t.log_image(name, image, self._step))

    def close(self) -> None:
        """Finish the trackers' runs (a tracker that never started has nothing to finish)."""
        if self._started:
            for t in list(self._trackers):
                self._guard(t, "finish", lambda t: t.finish())
        self._trackers = []


def sample_lines(rows: list[dict[str, Any]], exp: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """The ``samples.jsonl`` lines of one step's experience ``exp`` (``N = B·G`` completions of the
    ``B`` ``rows``), one per completion:

    - ``prompt``: the row's question (what reward functions get as ``prompts``), ``answer``;
    - ``model_prompt``: the text the model was given, decoded from its prompt tokens (template,
      system prompt, chat template and BOS as the model saw them; padding left out);
    - ``completion``, ``reward`` (the weighted total; None: unscorable), ``truncated`` (no EOS
      within the limit);
    - ``rewards``: each reward function's own value (before its weight) by the label of its
      ``rewards/<label>`` metric (None: the function gave None), when the pipeline recorded them
      (``exp.reward_parts``);
    - ``advantage``: the completion's advantage; under process supervision (token advantages
      ``(N, T)``) that of its first token, the sum of its normalized step rewards;
    - ``turns`` (multi-turn rollouts only): the transcript as its model and environment turns
      (:func:`transcript_turns`).
    """
    adv = exp.advantages
    if adv is not None and adv.dim() == 2:
        adv = adv[:, 0]  # token advantages: the first token's sums every step's normalized reward
    group = exp.group_index.tolist()
    firsts = {b: i for i, b in reversed(list(enumerate(group)))}  # a group's first row (its prompt's tokens)
    seen = {
        b: tokenizer.decode(exp.prompt_ids[i][exp.prompt_mask[i]].tolist(), skip_special_tokens=False)
        for b, i in firsts.items()
    }
    truncated = exp.truncated.tolist() if exp.truncated is not None else [None] * len(group)

    def num(v: float) -> float | None:
        return float(v) if math.isfinite(v) else None

    lines = [
        {
            "prompt": rows[b]["prompt"],
            "answer": rows[b].get("answer"),
            "model_prompt": seen[b],
            "completion": text,
            "reward": num(r),
            "advantage": None if adv is None else num(float(adv[i])),
            "truncated": truncated[i],
        }
        for i, (b, text, r) in enumerate(zip(group, exp.completions, exp.rewards.tolist()))
    ]
    parts = getattr(exp, "reward_parts", None)
    if parts:
        values = {k: v.tolist() for k, v in parts.items()}
        for i, line in enumerate(lines):
            line["rewards"] = {k: num(v[i]) for k, v in values.items()}
    if getattr(exp, "attention_mask", None) is not None:
        for i, line in enumerate(lines):
            line["turns"] = transcript_turns(exp, i, tokenizer)
    return lines


def env_metrics(exp: Any) -> dict[str, float]:
    """A multi-turn step's ``env/<count>`` metrics: the mean over rows of each of ``exp.env_counts``
    (``env/turns``, ``env/tool_calls``, ``env/tool_errors``, ``env/tool_timeouts``, ``env/env_tokens``;
    ``env/budget_cut``: the fraction of rows cut by ``rollout.max_total_tokens``); {} for a single-turn
    experience."""
    counts = getattr(exp, "env_counts", None)
    if not counts:
        return {}
    return {f"env/{k}": float(v.double().mean()) for k, v in sorted(counts.items())}


def transcript_turns(exp: Any, row: int, tokenizer: Any) -> list[dict[str, str]]:
    """Row ``row`` of a multi-turn experience as its turns, ``[{"by": "model" | "env", "text": ...}]``
    (runs of ``completion_mask`` within the attended tokens, decoded with special tokens kept)."""
    attended = int(exp.attention_mask[row].sum())
    ids, by_model = exp.completion_ids[row, :attended].tolist(), exp.completion_mask[row, :attended].tolist()
    turns: list[dict[str, str]] = []
    start = 0
    for i in range(1, attended + 1):
        if i == attended or by_model[i] != by_model[start]:
            text = tokenizer.decode(ids[start:i], skip_special_tokens=False)
            turns.append({"by": "model" if by_model[start] else "env", "text": text})
            start = i
    return turns


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All lines of a ``metrics.jsonl`` (read as UTF-8), as dicts.

    Raises:
        FileNotFoundError: no such file.
        ValueError: bytes that are not UTF-8 (:class:`grpokit.utils.textio.NotUtf8Error`: file, line,
            byte offset) or a line that is not valid JSON (file, line); one-line messages.
    """
    out = []
    for lineno, line in enumerate(read_utf8(path).splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {lineno} is not valid JSON: {e}") from None
    return out


#: a kind of warning repeats at most once per this many steps (each step's metrics say it anyway)
WARN_EVERY_STEPS = 10


def warn_if_step_did_nothing(
    metrics: dict[str, Any], advantages: torch.Tensor, *, max_new_tokens: int, warned_at: dict[str, int]
) -> list[str]:
    """Warn (``RunWarning``) when a step carried no or little learning signal; returns the kinds.

    - ``truncated``: at least :data:`TRUNCATED_WARN_FRAC` of the completions hit
      ``rollout.max_new_tokens`` (their ends, and a final answer, were never seen);
    - ``no_signal``: every advantage is exactly 0 (every group's rewards equal, or unscorable):
      the policy-gradient term of the update is zero;
    - ``reward_failures``: reward rows raised or timed out and were scored unscorable;
    - ``skipped_update``: an update was skipped as non-finite.

    Each kind is said on its first step and then at most once every :data:`WARN_EVERY_STEPS`
    steps (``warned_at``: kind -> step it was last said, updated here; the metrics line of every
    step has the numbers: ``truncated_frac``, ``frac_zero_std``, ``unscorable_frac``,
    ``reward_failures``, ``skipped_updates``). Under process supervision ``no_signal`` quotes
    ``step_frac_zero_std``: the advantages come from the step rewards, so that is the fraction
    that explains them (``frac_zero_std`` of the outcome rewards follows it).
    """
    step = metrics["step"]
    found: dict[str, str] = {}
    if metrics["truncated_frac"] >= TRUNCATED_WARN_FRAC:
        found["truncated"] = (
            f"{metrics['truncated_frac']:.0%} of the completions reached rollout.max_new_tokens="
            f"{max_new_tokens} without an EOS; raise rollout.max_new_tokens (or ask for "
            "shorter answers) so that rewards see whole answers"
        )
    if not bool(advantages.ne(0).any()):
        if metrics["unscorable_frac"] == 1.0:
            why = "every reward was unscorable"
        elif metrics.get("step_frac_zero_std") is not None:  # process supervision: the step rewards decide
            why = (
                f"every group's step rewards were equal (step_frac_zero_std={metrics['step_frac_zero_std']:.2f}; "
                f"outcome rewards: frac_zero_std={metrics['frac_zero_std']:.2f}, "
                f"unscorable_frac={metrics['unscorable_frac']:.2f})"
            )
        else:
            why = (
                f"every group's rewards were equal (frac_zero_std={metrics['frac_zero_std']:.2f}, "
                f"unscorable_frac={metrics['unscorable_frac']:.2f})"
            )
        found["no_signal"] = (
            f"no learning signal: {why}, so every advantage is 0 and the policy-"
            "gradient term of this update is zero"
            + (" (the optimizer step was skipped: zero gradient)" if metrics.get("zero_grad_updates") else "")
        )
    if metrics.get("reward_failures"):
        found["reward_failures"] = (
            f"{metrics['reward_failures']} reward rows raised or timed out and "
            "were scored unscorable (rewards.on_error=none)"
        )
    if metrics.get("skipped_updates"):
        found["skipped_update"] = f"{metrics['skipped_updates']} update(s) skipped: non-finite loss or gradient norm"
    for kind, text in found.items():
        if kind not in warned_at or step - warned_at[kind] >= WARN_EVERY_STEPS:
            warned_at[kind] = step
            warnings.warn(f"step {step}: {text}", RunWarning, stacklevel=2)
    return list(found)
