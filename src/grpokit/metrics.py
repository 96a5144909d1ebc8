"""Run outputs: metrics.jsonl, TensorBoard events and samples.jsonl (curves.png: :mod:`grpokit.curves`)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from grpokit.importing import require, warn_missing
from grpokit.textio import NotUtf8Error, read_utf8

#: the keys every metrics.jsonl line carries (the public contract; tests check them).
METRIC_KEYS = (
    "step", "reward_mean", "reward_std", "frac_zero_std", "loss", "kl", "clip_frac_low",
    "clip_frac_high", "entropy", "completion_len_mean", "truncated_frac", "grad_norm", "lr",
    "step_s", "gen_s", "train_s", "tokens_per_s",
    # reliability: unscorable rewards, reward rows that raised/timed out, updates skipped as non-finite
    "unscorable_frac", "reward_failures", "skipped_updates",
)


class RunWarning(UserWarning):
    """A step (or an evaluation) that trained on, or measured, little or nothing
    (:func:`grpokit.trainer.warn_if_step_did_nothing`)."""


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

    def close(self) -> None:
        """Nothing to close."""


class RunLogger:
    """Appends one JSON line per step to ``metrics.jsonl`` and mirrors scalars to TensorBoard.

    TensorBoard is the optional extra ``grpokit[tensorboard]``: without it (``tensorboard=True``)
    a :class:`~grpokit.importing.MissingExtraWarning` naming the extra is given once and only the
    jsonl files are written."""

    def __init__(self, output_dir: str | Path, *, tensorboard: bool = True):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        self._tb = None
        if tensorboard:
            try:
                require("tensorboard", extra="tensorboard", why="the TensorBoard mirror of the metrics")
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # tensorboard not installed: jsonl only
                warn_missing(e, f"writing {self.metrics_path.name} only")
            else:
                self._tb = SummaryWriter(str(self.dir / "tensorboard"))

    def truncate_after(self, step: int) -> None:
        """Drop lines of steps > ``step`` (a resumed run rewrites them), and a line torn by a kill
        mid-write. The file is replaced atomically.

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

    def log(self, metrics: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, metrics["step"])
            self._tb.flush()

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        with self.samples_path.open("a") as f:
            for s in samples:
                f.write(json.dumps({"step": step, **s}) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def sample_lines(rows: list[dict[str, Any]], exp: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """The ``samples.jsonl`` lines of one step's experience ``exp`` (``N = B·G`` completions of the
    ``B`` ``rows``), one per completion:

    - ``prompt``: the row's question (what reward functions get as ``prompts``), ``answer``;
    - ``model_prompt``: the text the model was given, decoded from its prompt tokens (template,
      system prompt, chat template and BOS as the model saw them; padding left out);
    - ``completion``, ``reward`` (None: unscorable), ``truncated`` (no EOS within the limit);
    - ``advantage``: the completion's advantage; under process supervision (token advantages
      ``(N, T)``) that of its first token, the sum of its normalized step rewards.
    """
    adv = exp.advantages
    if adv is not None and adv.dim() == 2:
        adv = adv[:, 0]  # token advantages: the first token's sums every step's normalized reward
    group = exp.group_index.tolist()
    firsts = {b: i for i, b in reversed(list(enumerate(group)))}  # a group's first row (its prompt's tokens)
    seen = {b: tokenizer.decode(exp.prompt_ids[i][exp.prompt_mask[i]].tolist(), skip_special_tokens=False)
            for b, i in firsts.items()}
    truncated = exp.truncated.tolist() if exp.truncated is not None else [None] * len(group)

    def num(v: float) -> float | None:
        return float(v) if math.isfinite(v) else None

    return [{"prompt": rows[b]["prompt"], "answer": rows[b].get("answer"), "model_prompt": seen[b],
             "completion": text, "reward": num(r), "advantage": None if adv is None else num(float(adv[i])),
             "truncated": truncated[i]}
            for i, (b, text, r) in enumerate(zip(group, exp.completions, exp.rewards.tolist()))]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All lines of a ``metrics.jsonl`` (read as UTF-8), as dicts.

    Raises:
        FileNotFoundError: no such file.
        ValueError: bytes that are not UTF-8 (:class:`grpokit.textio.NotUtf8Error`: file, line,
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
