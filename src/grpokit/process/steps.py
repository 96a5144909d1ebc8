"""Step segmentation for process supervision (DeepSeekMath §4.1.3).

A completion is cut into reasoning *steps*; each step gets one reward, stored at the step's last
completion token (``step_rewards (N, T)`` / ``step_end_mask (N, T)``; docs/design.md, "Step
rewards"). Three stages:

1. :func:`split_steps`: character spans ``(start, end)`` of the steps of a text. The spans cover
   the whole text contiguously (``spans[k][1] == spans[k+1][0]``, first start 0, last end
   ``len(text)``), so every character belongs to exactly one step.
2. :func:`step_token_ends` (one row) / :func:`step_end_masks` (a batch): map each step end to the
   index of its last completion token. Character offsets come from *incrementally decoding the
   actual ids* (:func:`token_char_ends`), never from re-tokenizing the text (which can give other
   ids). A token that straddles a step boundary belongs to the step in which it **ends**; a token
   that produces no characters (a skipped special token, or a piece of a multi-byte character)
   goes with the next token that does (trailing ones, e.g. the EOS, with the last step). A step
   left with no token of its own (all its characters sit inside a token that ends in a later step)
   is **merged into the next step**; the spans returned are the merged ones, so there is always
   exactly one span per True entry of the mask row. The last step always ends at the last
   unmasked token (the EOS, which decodes to nothing, belongs to it).
3. :func:`scatter_step_rewards`: place one score per (merged) step at the step-end tokens.

Nothing here knows about rewards; see ``grpokit.process.verifier`` and ``grpokit.process.prm``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "split_steps",
    "step_texts",
    "token_char_ends",
    "step_token_ends",
    "step_end_masks",
    "scatter_step_rewards",
]

Span = tuple[int, int]

_BLANK_LINE = re.compile(r"[^\S\n]*\n")  # a line holding only spaces/tabs/\r, with its newline


def _boundaries_to_spans(text: str, starts: list[int]) -> list[Span]:
    """Spans from step start offsets: keep those after the first non-space char, sorted, unique."""
    if not text:
        return []
    first = len(text) - len(text.lstrip())  # leading whitespace attaches to the first step
    cuts = sorted({s for s in starts if first < s < len(text)})
    edges = [0, *cuts, len(text)]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _line_starts(text: str) -> list[tuple[int, bool]]:
    """(offset, is_blank) of every line; lines are separated by ``\\n`` only."""
    out, pos = [], 0
    for line in text.split("\n"):
        out.append((pos, line.strip() == ""))
        pos += len(line) + 1
    return out


def split_steps(text: str, rule: str = "lines") -> list[Span]:
    """Cut ``text`` into reasoning steps; return their character spans.

    Rules:

    - ``"lines"`` (default): each non-blank line starts a step. Lines are separated by ``"\\n"``
      only (``"\\r"`` is ordinary whitespace). The newline ending a line, and any following blank
      (whitespace-only) lines, belong to the preceding step, so a step ends just before the first
      character of the next non-blank line.
    - ``"paragraphs"``: a step starts at each non-blank line that follows one or more blank lines.
    - ``"regex:<pattern>"``: a step starts at each match of ``<pattern>`` (``re.search``
      semantics; use ``(?m)`` for line anchors), e.g. ``r"regex:Step \\d+:"``.
    - ``"tag:<string>"``: each occurrence of ``<string>`` *ends* a step (Math-Shepherd ``tag:ки``);
      whitespace right after the tag also belongs to the ending step.

    Whatever the rule: whitespace before the first step belongs to the first step; a text with no
    break is one step; a whitespace-only text is one step; ``""`` gives ``[]``.

    Args:
        text: the completion text.
        rule: one of the rules above.

    Returns:
        ``[(start, end), ...]`` covering ``text`` contiguously; ``text[start:end]`` is the step.

    Raises:
        ValueError: unknown rule, empty tag, or a regex that does not compile.

    >>> t = "  a = 1\\n\\nb = 2\\nc"
    >>> [t[s:e] for s, e in split_steps(t)]
    ['  a = 1\\n\\n', 'b = 2\\n', 'c']
    >>> [t[s:e] for s, e in split_steps(t, "paragraphs")]
    ['  a = 1\\n\\n', 'b = 2\\nc']
    >>> t = "x ки\\ny ки"
    >>> [t[s:e] for s, e in split_steps(t, "tag:ки")]
    ['x ки\\n', 'y ки']
    """
    if rule == "lines":
        starts = [pos for pos, blank in _line_starts(text) if not blank]
    elif rule == "paragraphs":
        lines = _line_starts(text)
        starts = [lines[i][0] for i in range(1, len(lines)) if not lines[i][1] and lines[i - 1][1]]
    elif rule.startswith("regex:"):
        try:
            pattern = re.compile(rule[len("regex:") :])
        except re.error as e:
            raise ValueError(f"split_steps: bad regex in rule {rule!r}: {e}") from e
        starts = [m.start() for m in pattern.finditer(text)]
    elif rule.startswith("tag:"):
        tag = rule[len("tag:") :]
        if not tag:
            raise ValueError("split_steps: rule 'tag:' needs a non-empty tag, e.g. 'tag:ки'")
        starts = []
        for m in re.finditer(re.escape(tag), text):
            end = m.end()
            while end < len(text) and text[end].isspace():
                end += 1
            starts.append(end)
    else:
        raise ValueError(
            f"split_steps: unknown rule {rule!r}; use 'lines', 'paragraphs', 'regex:<pattern>' or 'tag:<string>'"
        )
    return _boundaries_to_spans(text, starts)


def step_texts(text: str, spans: Sequence[Span]) -> list[str]:
    """The step strings ``[text[s:e] for s, e in spans]`` (they concatenate back to ``text``)."""
    return [text[s:e] for s, e in spans]


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def token_char_ends(ids: Sequence[int], tokenizer: Any) -> tuple[str, list[int]]:
    """Decode ``ids`` and give, for each token, how many characters the prefix up to it produced.

    ``text = tokenizer.decode(ids, skip_special_tokens=True)``; ``ends[i]`` is the number of
    characters of ``text`` that ``decode(ids[: i + 1])`` has produced: its longest prefix agreeing
    with ``text``, not counting a trailing U+FFFD (an incomplete multi-byte character). So
    ``ends`` is non-decreasing with ``ends[-1] == len(text)``; a special token (skipped) or a token
    holding only part of a character produces no characters, and a character is credited to the
    token that completes it. Computed by incremental decoding over a
    short window (vLLM-style); if that does not reproduce ``text`` exactly, falls back to decoding
    every prefix (quadratic, always consistent with ``text``).

    Args:
        ids: the completion token ids (list or 1-D tensor), only the tokens that count.
        tokenizer: a Hugging Face tokenizer.

    Returns:
        ``(text, ends)`` with ``len(ends) == len(ids)``.
    """
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
    full = _decode(tokenizer, ids)
    ends: list[int] = []
    out_len, prefix, read = 0, 0, 0
    pieces = []
    for i in range(len(ids)):
        prev = _decode(tokenizer, ids[prefix:read]) if read > prefix else ""
        new = _decode(tokenizer, ids[prefix : i + 1])
        if len(new) > len(prev) and not new.endswith("\ufffd") and new.startswith(prev):
            pieces.append(new[len(prev) :])
            out_len += len(new) - len(prev)
            prefix, read = read, i + 1
            ends.append(out_len)
        else:  # pending multi-byte character: credit the complete characters before it
            stable = new.rstrip("\ufffd")
            extra = len(stable) - len(prev) if stable.startswith(prev) else 0
            ends.append(max(out_len + max(extra, 0), ends[-1] if ends else 0))
    if "".join(pieces) == full:
        return full, ends
    return full, _char_ends_slow(ids, tokenizer, full)


def _char_ends_slow(ids: list[int], tokenizer: Any, full: str) -> list[int]:
    """Quadratic reference for :func:`token_char_ends`: decode every prefix, compare with ``full``."""
    ends, best = [], 0
    for i in range(len(ids)):
        p = _decode(tokenizer, ids[: i + 1]).rstrip("\ufffd")
        k = 0
        while k < min(len(p), len(full)) and p[k] == full[k]:
            k += 1
        best = max(best, k)
        ends.append(best)
    if ends:
        ends[-1] = len(full)
    return ends


def step_token_ends(
    completion_ids: Sequence[int] | torch.Tensor,
    num_tokens: int,
    spans: Sequence[Span] | None,
    tokenizer: Any,
    *,
    rule: str = "lines",
    text: str | None = None,
) -> tuple[list[int], list[Span], str]:
    """Token index of the last token of each step of one completion.

    Args:
        completion_ids: ``(T,)`` ids (list or tensor); only the first ``num_tokens`` count.
        num_tokens: number of counted tokens (``completion_mask[i].sum()``, EOS included).
        spans: step spans over the decoded text of the counted tokens, e.g. from
            :func:`split_steps`; None -> ``split_steps(decoded, rule)``.
        tokenizer: the tokenizer that produced the ids.
        rule: used only when ``spans`` is None.
        text: if given, must equal the decoded text (a check that spans refer to the right text).

    Returns:
        ``(ends, merged_spans, decoded_text)``: ``ends`` strictly increasing token indices, one per
        merged step, ``ends[-1] == num_tokens - 1``; ``merged_spans`` the spans after merging steps
        with no token of their own into the next one (see module docstring). A completion whose
        tokens decode to ``""`` (e.g. only an EOS) is one empty step ``(0, 0)`` at its last token,
        so it can still be scored; ``num_tokens == 0`` gives no step.

    Raises:
        ValueError: ``text`` differs from the decoded ids, or ``spans`` do not cover the decoded
            text contiguously.
    """
    ids = completion_ids.tolist() if isinstance(completion_ids, torch.Tensor) else list(completion_ids)
    if not 0 <= num_tokens <= len(ids):
        raise ValueError(f"step_token_ends: num_tokens={num_tokens} outside [0, {len(ids)}]")
    decoded, ends = token_char_ends(ids[:num_tokens], tokenizer)
    if text is not None and text != decoded:
        raise ValueError(
            "step_token_ends: `text` is not the decode of the completion ids "
            f"(decode(ids, skip_special_tokens=True) = {decoded[:60]!r}..., text = {text[:60]!r}...); "
            "pass the texts your rollout decoded with skip_special_tokens=True, or None"
        )
    if num_tokens == 0:
        return [], [], decoded
    spans = list(split_steps(decoded, rule) if spans is None else spans)
    if not spans:
        spans = [(0, 0)]
    if (
        spans[0][0] != 0
        or spans[-1][1] != len(decoded)
        or any(spans[k][1] != spans[k + 1][0] for k in range(len(spans) - 1))
    ):
        raise ValueError(
            f"step_token_ends: spans {spans[:3]}... do not cover the decoded text (length {len(decoded)}) contiguously"
        )
    # a token producing no characters (a skipped special token, or a piece of a multi-byte
    # character) goes with the next token that does: give it that token's end offset
    eff, nxt = list(ends), len(decoded)
    for i in reversed(range(num_tokens)):
        if ends[i] == (ends[i - 1] if i else 0):
            eff[i] = nxt
        else:
            nxt = ends[i]
    out_ends: list[int] = []
    out_spans: list[Span] = []
    start, prev_idx = 0, -1
    for k, (_, e) in enumerate(spans):
        last = k == len(spans) - 1
        idx = num_tokens - 1 if last else bisect.bisect_right(eff, e) - 1
        if idx <= prev_idx:  # no token ends inside this step: it merges into the next one
            if last and out_spans:  # nothing after it: widen the previous step instead
                out_spans[-1] = (out_spans[-1][0], e)
                out_ends[-1] = num_tokens - 1
            continue
        out_ends.append(idx)
        out_spans.append((start, e))
        start, prev_idx = e, idx
    return out_ends, out_spans, decoded


def step_end_masks(
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    texts: Sequence[str] | None,
    rule: str,
    tokenizer: Any,
) -> tuple[torch.Tensor, list[list[Span]]]:
    """Batched :func:`step_token_ends`: the ``(N, T)`` step-end mask and the merged spans.

    Row i's counted tokens are ``completion_ids[i][completion_mask[i]]``; the mask must be a
    prefix (True then False), as everywhere in grpokit.

    Args:
        completion_ids: ``(N, T)`` long.
        completion_mask: ``(N, T)`` bool, True = token counts (first EOS included).
        texts: the decoded completions (``decode(ids, skip_special_tokens=True)``, checked), or None
            to decode here.
        rule: a :func:`split_steps` rule.
        tokenizer: the tokenizer that produced the ids.

    Returns:
        ``step_end_mask (N, T)`` bool, True at the last token of each step (only on counted
        tokens; the last True of a non-empty row is its last counted token), and per row the list of
        merged spans, one per True entry, in order. Step strings:
        ``step_texts(texts[i], spans[i])``.

    Raises:
        ValueError: shape mismatch, a non-prefix mask, or a text that is not the decode of its ids.
    """
    if completion_ids.dim() != 2 or completion_ids.shape != completion_mask.shape:
        raise ValueError(
            f"step_end_masks: completion_ids {tuple(completion_ids.shape)} and completion_mask "
            f"{tuple(completion_mask.shape)} must both be (N, T)"
        )
    n, t = completion_ids.shape
    if texts is not None and len(texts) != n:
        raise ValueError(f"step_end_masks: {len(texts)} texts for {n} rows")
    mask = completion_mask.bool()
    lengths = mask.sum(dim=1)
    prefix = torch.arange(t, device=mask.device)[None, :] < lengths[:, None]
    if not torch.equal(prefix, mask):
        raise ValueError("step_end_masks: completion_mask must be True on a prefix of each row")
    out = torch.zeros(n, t, dtype=torch.bool)
    all_spans = []
    ids_list = completion_ids.tolist()
    for i in range(n):
        ends, spans, _ = step_token_ends(
            ids_list[i],
            int(lengths[i]),
            None,
            tokenizer,
            rule=rule,
            text=None if texts is None else texts[i],
        )
        out[i, ends] = True
        all_spans.append(spans)
    return out.to(completion_mask.device), all_spans


def scatter_step_rewards(
    scores: Sequence[Sequence[float | None] | None],
    step_end_mask: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Place per-step scores at the step-end tokens.

    ``step_rewards[i, t] = scores[i][k]`` where t is the k-th True entry of ``step_end_mask[i]``,
    0.0 elsewhere. A ``None`` score (the step cannot be scored) becomes **NaN**: the caller
    decides; ``grpokit.algo.process_advantages`` leaves NaN step rewards out of the
    group statistics and counts them as 0 in the token sums. A ``None`` *row* (the process reward
    could not score that completion at all, e.g. it raised under ``rewards.on_error=none``) is
    unscorable: NaN at every one of its steps.

    Args:
        scores: per row, one score per step (``float | None``), ``len(scores[i]) ==
            step_end_mask[i].sum()``; or ``None`` for the whole row.
        step_end_mask: ``(N, T)`` bool.
        dtype: float dtype of the result.

    Returns:
        ``(step_rewards (N, T) dtype, num_steps (N,) long)``.

    Raises:
        ValueError: wrong number of rows; a row (named in the message) that is not None, not a
            list, or not one score per step; a score that is not a number.

    >>> m = torch.tensor([[False, True, True], [False, False, True]])
    >>> r, k = scatter_step_rewards([[1.0, None], [0.5]], m)
    >>> r.tolist(), k.tolist()
    ([[0.0, 1.0, nan], [0.0, 0.0, 0.5]], [2, 1])
    >>> scatter_step_rewards([None, [0.5]], m)[0].tolist()
    [[0.0, nan, nan], [0.0, 0.0, 0.5]]
    """
    mask = step_end_mask.bool()
    if mask.dim() != 2 or len(scores) != mask.shape[0]:
        raise ValueError(f"scatter_step_rewards: {len(scores)} score rows for step_end_mask {tuple(mask.shape)}")
    num_steps = mask.sum(dim=1)
    flat = []
    for i, row in enumerate(scores):
        k = int(num_steps[i])
        if row is None:  # the whole row is unscorable
            flat.extend([float("nan")] * k)
            continue
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__"):  # lists, tuples, tensors
            raise ValueError(
                f"scatter_step_rewards: row {i} is {type(row).__name__} {row!r:.60}, expected a list "
                f"of {k} step scores or None"
            )
        if len(row) != k:
            raise ValueError(f"scatter_step_rewards: row {i} has {len(row)} scores but {k} steps")
        for j, v in enumerate(row):
            try:
                flat.append(float("nan") if v is None else float(v))
            except (TypeError, ValueError):
                raise ValueError(
                    f"scatter_step_rewards: row {i}, step {j}: score {v!r:.60} is not a number or None"
                ) from None
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    out[mask] = torch.tensor(flat, dtype=dtype, device=mask.device)  # row-major = step order
    return out, num_steps.long()
