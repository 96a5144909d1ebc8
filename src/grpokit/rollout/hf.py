"""Rollouts with Hugging Face ``model.generate`` (CPU or one GPU).

``generate_rollouts`` samples ``G`` completions for each of ``B`` prompts:

1. tokenize the prompts as given (already formatted for the model) with exactly one BOS where
   the tokenizer adds one (:func:`grpokit.models.encode_prompts`), left-padded to a common ``P``;
2. repeat each prompt ``G`` times (``repeat_interleave``), so the ``N = B·G`` rows are grouped:
   rows ``b·G … b·G+G-1`` are prompt ``b``'s group;
3. one batched ``model.generate`` call over all rows (or over chunks of ``chunk_size`` rows, padded
   to a common completion length ``T`` afterwards), under ``torch.inference_mode()``, with an
   explicit ``GenerationConfig`` built from the recipe's :class:`SamplingParams`;
4. ``completion_mask`` from ``grpokit.algo.mask_completions`` (True up to and including the first
   EOS, never derived from the pad id), ``truncated`` = no EOS within ``max_new_tokens``;
5. decode each completion up to (excluding) its first EOS, skipping special tokens.

Speed (each switchable, none changes the sampling rule; ``tests/test_policy_fast.py`` checks that
the fast paths sample the same tokens as the plain one on a tiny model):

- ``share_prompt=True`` (default): ``generate`` would run the prefill over all ``N = B·G`` rows,
  i.e. each prompt G times. Instead the first ``P-1`` prompt columns of each *distinct* prompt in
  a chunk run once; their KV cache is repeated to the rows and handed to ``generate``, which then
  only runs the last prompt column before sampling.
- ``static_cache=True`` (default): that cache is a preallocated ``StaticCache`` of ``P +
  max_new_tokens`` positions written in place, instead of a ``DynamicCache`` that concatenates
  (copies) every layer's whole cache at every new token; on CPU the copies cost about a third of
  a decode step. No ``torch.compile`` is involved (``disable_compile=True``).
- ``sampler_dtype=torch.bfloat16``: sample from a bf16 copy of the weights (made once, refreshed
  from the model at every call), for the bf16 setting (``model.autocast_bf16``) where the trainer
  scores in bf16 too. Decode steps on CPU are bound by reading the weights; bf16 halves that.
- ``packed_weights=True`` (default): on CPU the linear layers run on copies of their weights
  packed once per call for oneDNN (:mod:`grpokit.rollout.packed`) instead of being re-packed by
  the BLAS library at every decode step: 0.27 → 0.20 ms per 576×1536 layer in bf16 at 32 rows,
  0.64 → 0.34 ms in float32. bf16 logits are bit-identical; float32 ones differ by summation order.
- ``SamplingParams.sampler="inverse_cdf"`` (default): the next token is drawn by a logits
  processor with one uniform number per row (:mod:`grpokit.rollout.sampling`) instead of
  ``torch.multinomial`` (one exponential number per vocabulary entry: ~33 ms of a ~130 ms decode
  step for 32 rows × 49k entries). Same distribution, different draws for a seed.
The model's own ``generation_config`` (which may carry ``top_p``, ``temperature``, ``top_k``,
``max_length`` from the hub) never overrides the recipe: transformers fills every field left
``None`` from it, so :func:`build_generation_config` sets each sampling field explicitly, including
the "off" values (``top_k=0``, ``min_p=0.0``, ``top_p=1.0``).
"""

from __future__ import annotations

import contextlib
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.algo import completion_terminated, mask_completions
from grpokit.policy import cache_kwarg, distinct_rows, dynamic_prefix_cache
from grpokit.rollout.packed import packed_linear_weights

# Fields that transformers only switches off when they are ``None`` -- which it then fills from
# the model's generation_config. We cannot neutralise them through our config; warn if set.
_NONE_ONLY_FIELDS = (
    "top_h",
    "sequence_bias",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "exponential_decay_length_penalty",
    "watermarking_config",
    "stop_strings",
    "max_time",
)


@dataclass
class SamplingParams:
    """How completions are sampled. ``temperature == 0`` means greedy decoding."""

    temperature: float = 1.0
    """Softmax temperature; 0 = greedy (argmax). The trainer divides logits by the same value."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 = off."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 = off."""
    min_p: float = 0.0
    """Drop tokens with probability below min_p × the top token's probability; 0 = off."""
    max_new_tokens: int = 256
    """Completion length limit T_max (>= 1); a completion without EOS by then is truncated."""
    repetition_penalty: float = 1.0
    """CTRL repetition penalty (> 0); 1 = off."""
    sampler: str = "inverse_cdf"
    """How a token is drawn from the warped distribution: ``inverse_cdf`` (one uniform number per
    row, :mod:`grpokit.rollout.sampling`) or ``multinomial`` (``generate``'s own
    ``torch.multinomial``). Same distribution; inverse_cdf is ~30 ms per decode step cheaper on
    CPU for a 49k vocabulary."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field out of range."""
        checks = [
            ("temperature", self.temperature >= 0, ">= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= 0, "an int >= 0"),
            ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
            ("max_new_tokens", isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
             "an int >= 1"),
            ("repetition_penalty", self.repetition_penalty > 0, "> 0"),
            ("sampler", self.sampler in ("inverse_cdf", "multinomial"), "'inverse_cdf' or 'multinomial'"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} must be {want}, got {getattr(self, name)!r}")


@dataclass
class Rollout:
    """``N = B·G`` sampled completions, grouped by prompt. Tensors live on the model's device.

    Rows ``b·G … b·G+G-1`` all come from prompt ``b`` (``prompt_index[b·G + g] == b``).
    Feed ``torch.cat([prompt_ids, completion_ids], 1)`` with attention mask
    ``torch.cat([prompt_mask, completion_mask], 1)`` to score the completions.
    """

    prompt_ids: torch.Tensor
    """``(N, P)`` long, left-padded prompt tokens (each prompt repeated G times)."""
    prompt_mask: torch.Tensor
    """``(N, P)`` bool, True on real prompt tokens (False on left padding)."""
    completion_ids: torch.Tensor
    """``(N, T)`` long, sampled tokens; after the first EOS the content is padding (any id)."""
    completion_mask: torch.Tensor
    """``(N, T)`` bool, True up to and including the first EOS (``mask_completions``)."""
    truncated: torch.Tensor
    """``(N,)`` bool, True where no EOS was produced within ``max_new_tokens``."""
    completions: list[str]
    """``N`` decoded completions: text before the first EOS, special tokens skipped."""
    prompt_index: torch.Tensor
    """``(N,)`` long, which prompt (0 … B-1) each row came from."""
    group_size: int
    """``G``."""
    gen_s: float
    """Wall-clock seconds spent in ``model.generate``."""

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select_groups(self, groups: Sequence[int]) -> "Rollout":
        """The rows of the given groups (prompt indices ``b``), in that order, renumbered 0 … len-1."""
        G = self.group_size
        rows = torch.tensor([b * G + g for b in groups for g in range(G)], dtype=torch.long,
                            device=self.completion_ids.device)
        idx = rows.tolist()
        return Rollout(
            prompt_ids=self.prompt_ids[rows], prompt_mask=self.prompt_mask[rows],
            completion_ids=self.completion_ids[rows], completion_mask=self.completion_mask[rows],
            truncated=self.truncated[rows], completions=[self.completions[i] for i in idx],
            prompt_index=torch.arange(len(groups), device=rows.device).repeat_interleave(G),
            group_size=G, gen_s=self.gen_s,
        )


def concat_rollouts(parts: Sequence[Rollout], pad_id: int) -> Rollout:
    """One :class:`Rollout` holding the groups of ``parts`` in order (same ``group_size``):
    prompts left-padded and completions right-padded with ``pad_id`` to common widths (masks False
    on the padding), prompt indices renumbered, ``gen_s`` summed.

    Raises:
        ValueError: ``parts`` empty, or group sizes differ.
    """
    if not parts:
        raise ValueError("concat_rollouts: no rollouts given")
    G = parts[0].group_size
    if any(r.group_size != G for r in parts):
        raise ValueError(f"concat_rollouts: group sizes differ: {[r.group_size for r in parts]}")
    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.completion_ids.shape[1] for r in parts)

    def pad(t: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
        extra = width - t.shape[1]
        return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

    n_groups = sum(len(r) // G for r in parts)
    device = parts[0].completion_ids.device
    return Rollout(
        prompt_ids=torch.cat([pad(r.prompt_ids, P, pad_id, True) for r in parts]),
        prompt_mask=torch.cat([pad(r.prompt_mask, P, False, True) for r in parts]),
        completion_ids=torch.cat([pad(r.completion_ids, T, pad_id, False) for r in parts]),
        completion_mask=torch.cat([pad(r.completion_mask, T, False, False) for r in parts]),
        truncated=torch.cat([r.truncated for r in parts]),
        completions=[c for r in parts for c in r.completions],
        prompt_index=torch.arange(n_groups, device=device).repeat_interleave(G),
        group_size=G, gen_s=sum(r.gen_s for r in parts),
    )


def build_generation_config(
    params: SamplingParams,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    bos_token_id: int | None = None,
) -> Any:
    """A ``transformers.GenerationConfig`` that states every field the recipe controls.

    Every sampling field is explicit (transformers would fill a ``None`` from the model's own
    ``generation_config``, or fall back to its global ``top_k=50``): ``do_sample``,
    ``temperature``, ``top_p``, ``top_k`` (0 = off), ``min_p`` (0.0 = off), ``repetition_penalty``,
    ``max_new_tokens`` (wins over any ``max_length``), ``min_new_tokens=0`` (wins over any
    ``min_length``), one sequence per row, no beams,
    no other warpers (``typical_p``, ``epsilon_cutoff``, ``eta_cutoff``, n-gram blocking).
    ``temperature == 0`` gives greedy decoding (``do_sample=False``; the sampling-only fields
    ``temperature/top_p/top_k/min_p`` are then left unset: transformers ignores them without
    sampling). With ``params.sampler == "inverse_cdf"`` the config is greedy too: the drawing is
    done by :func:`sampling_processors`, which ``generate`` must then receive as
    ``logits_processor``.
    """
    from transformers import GenerationConfig

    sample = params.temperature > 0 and params.sampler == "multinomial"
    return GenerationConfig(
        do_sample=sample,
        # Sampling-only fields: explicit when sampling; unused (so left unset) when greedy.
        temperature=float(params.temperature) if sample else None,
        top_p=float(params.top_p) if sample else None,
        top_k=int(params.top_k) if sample else None,
        min_p=float(params.min_p) if sample else None,
        repetition_penalty=float(params.repetition_penalty),
        max_new_tokens=int(params.max_new_tokens),  # takes precedence over any max_length
        max_length=None,
        min_new_tokens=0,  # takes precedence over any min_length
        num_beams=1,
        num_return_sequences=1,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        no_repeat_ngram_size=0,
        encoder_repetition_penalty=1.0,
        length_penalty=1.0,
        renormalize_logits=False,
        remove_invalid_values=False,
        use_cache=True,
        output_scores=False,
        output_logits=False,
        return_dict_in_generate=False,
        disable_compile=True,  # never torch.compile behind the user's back (static caches invite it)
        eos_token_id=list(eos_token_ids),
        pad_token_id=int(pad_token_id),
        bos_token_id=bos_token_id,
    )


def sampling_processors(params: SamplingParams) -> list[Any]:
    """The ``logits_processor`` list ``generate`` needs for ``params`` with the config of
    :func:`build_generation_config`: ``[InverseCDFSampler]`` when it samples by inverse CDF, else
    empty (``generate`` samples or decodes greedily by itself)."""
    if params.temperature > 0 and params.sampler == "inverse_cdf":
        from grpokit.rollout.sampling import InverseCDFSampler

        return [InverseCDFSampler(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                  min_p=params.min_p)]
    return []


def generate_rollouts(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    group_size: int,
    params: SamplingParams,
    *,
    eos_token_ids: Sequence[int],
    chunk_size: int | None = None,
    seed: int | None = None,
    share_prompt: bool = True,
    static_cache: bool = True,
    sampler_dtype: torch.dtype | None = None,
    packed_weights: bool = True,
) -> Rollout:
    """Sample ``group_size`` completions for each prompt with ``model.generate``.

    Args:
        model: a Hugging Face causal LM (train/eval mode is left as is; generation runs under
            ``torch.inference_mode()``).
        tokenizer: its tokenizer, with a pad token (see ``grpokit.models.load_tokenizer``).
            Prompts are always padded on the left, whatever ``tokenizer.padding_side`` says.
        prompts: ``B`` prompt strings, already formatted for the model (chat-templated or plain);
            encoded by :func:`grpokit.models.encode_prompts` (one BOS where the model expects one).
        group_size: ``G >= 1`` completions per prompt.
        params: the sampling recipe; the model's ``generation_config`` cannot override it.
        eos_token_ids: every id that ends a completion (``grpokit.models.eos_token_ids``).
        chunk_size: generate at most this many rows per ``generate`` call (memory bound); the
            chunks are right-padded with the pad id to a common ``T``. ``None`` = all ``N`` rows.
        seed: if given, sampling is seeded with ``torch.manual_seed(seed)`` inside
            ``torch.random.fork_rng``, so the output is reproducible and the caller's global RNG
            state is left untouched. Pass a different seed per step.
        share_prompt: prefill each distinct prompt once and repeat its KV cache to its G rows
            (module docstring); False = plain ``generate`` over all rows.
        static_cache: preallocated KV cache written in place (module docstring); False = the
            ``DynamicCache`` ``generate`` builds by default.
        sampler_dtype: ``None`` = sample with ``model`` as it is; a float dtype (bf16) = sample
            with a copy of its weights in that dtype, refreshed from ``model`` on every call.
        packed_weights: run the linear layers on weights packed once for oneDNN (module
            docstring; CPU only, a no-op elsewhere); False = ``F.linear`` on the plain weights.

    Returns:
        :class:`Rollout` with ``N = B·G`` rows, grouped by prompt, ``T <= max_new_tokens``.

    Raises:
        ValueError: ``group_size < 1``; ``prompts`` empty, not a list of strings, or containing an
            empty prompt; ``params.max_new_tokens < 1`` (or another field out of range);
            ``eos_token_ids`` empty; ``chunk_size < 1``; the tokenizer has no pad token.
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty; pass at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p:
            raise ValueError(f"prompts[{i}] must be a non-empty string, got {p!r}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    params.validate()
    eos = [int(i) for i in eos_token_ids]
    if not eos:
        raise ValueError("eos_token_ids is empty; pass at least one EOS id")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size!r}")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("tokenizer has no pad token; load it with grpokit.models.load_tokenizer")
    _warn_on_model_overrides(model)

    device = _model_device(model)
    ids_b, mask_b = left_padded_prompts(tokenizer, prompts, pad_id)  # (B, P)
    G = group_size
    prompt_ids = ids_b.repeat_interleave(G, dim=0).to(device)  # (N, P)
    prompt_mask = mask_b.repeat_interleave(G, dim=0).to(device)  # (N, P)
    prompt_index = torch.arange(len(prompts), device=device).repeat_interleave(G)  # (N,)
    N, P = prompt_ids.shape
    rows = N if chunk_size is None else chunk_size

    gen_config = build_generation_config(
        params, eos_token_ids=eos, pad_token_id=pad_id, bos_token_id=tokenizer.bos_token_id
    )
    processors = sampling_processors(params)
    if processors:
        from transformers import LogitsProcessorList

        extra_gen = {"logits_processor": LogitsProcessorList(processors)}
    else:
        extra_gen = {}
    chunks: list[torch.Tensor] = []
    t0 = time.perf_counter()
    with torch.inference_mode(), _seeded(seed, device):
        sampler = model if sampler_dtype is None else _sampler_copy(model, sampler_dtype)
        packing = packed_linear_weights(sampler, rows) if packed_weights else contextlib.nullcontext()
        with packing:
            for start in range(0, N, rows):
                ids = prompt_ids[start : start + rows]
                mask = prompt_mask[start : start + rows]
                cache = _prefix_cache(sampler, ids, mask, share=share_prompt, static=static_cache,
                                      max_len=P + params.max_new_tokens)
                extra = {} if cache is None else {cache_kwarg(sampler.forward): cache}
                out = sampler.generate(
                    input_ids=ids, attention_mask=mask.long(), generation_config=gen_config, **extra, **extra_gen
                )
                chunks.append(out[:, P:])  # (n, T_chunk): generate returns prompt + new tokens
    gen_s = time.perf_counter() - t0

    # A chunk shorter than the longest stopped early because all its rows hit EOS, so padding
    # it on the right never hides a truncation.
    T = max(c.shape[1] for c in chunks)
    completion_ids = torch.full((N, T), pad_id, dtype=torch.long, device=device)  # (N, T)
    start = 0
    for c in chunks:
        completion_ids[start : start + c.shape[0], : c.shape[1]] = c
        start += c.shape[0]

    completion_mask = mask_completions(completion_ids, eos)  # (N, T)
    truncated = ~completion_terminated(completion_ids, eos)  # (N,)
    n_text = completion_mask.sum(1) - (~truncated).long()  # tokens before the first EOS
    completions = tokenizer.batch_decode(
        [ids[:n].tolist() for ids, n in zip(completion_ids, n_text.tolist())],
        skip_special_tokens=True,
    )
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=truncated,
        completions=completions,
        prompt_index=prompt_index,
        group_size=G,
        gen_s=gen_s,
    )


def left_padded_prompts(tokenizer: Any, prompts: Sequence[str], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both ``(B, P)``: the prompts encoded by :func:`grpokit.models.encode_prompts`
    (one BOS where the model expects one), left-padded with ``pad_id``; ``mask`` (bool) is True on
    real tokens.

    Raises:
        ValueError: a prompt encodes to no tokens (names its index).
    """
    from grpokit.models import encode_prompts

    encoded = encode_prompts(tokenizer, list(prompts))
    for i, x in enumerate(encoded):
        if not x:
            raise ValueError(f"prompts[{i}] tokenizes to no tokens")
    p = max(len(x) for x in encoded)
    ids = torch.full((len(encoded), p), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(encoded), p), dtype=torch.bool)
    for i, x in enumerate(encoded):
        ids[i, p - len(x):] = torch.tensor(x, dtype=torch.long)
        mask[i, p - len(x):] = True
    return ids, mask


def _prefix_cache(model: Any, ids: torch.Tensor, mask: torch.Tensor, *, share: bool, static: bool,
                  max_len: int) -> Any:
    """The KV cache to hand ``generate`` for the prompt rows ``ids`` ``(n, P)``, or None (then
    ``generate`` prefills all rows into its default ``DynamicCache``).

    ``share``: the first ``P-1`` columns run once per distinct prompt, then are repeated to the
    rows. ``static``: the cache is a ``StaticCache`` of ``max_len`` positions (the shared prefix,
    if any, copied into it). Models whose layers are not plain growing KV layers get None.
    """
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    n, p = ids.shape
    if dynamic_prefix_cache(model) is None:  # sliding-window / recurrent layers: leave it to generate
        return None
    first, inverse = distinct_rows(ids, mask) if share and p > 1 else (torch.arange(n), None)
    shared = inverse is not None and len(first) < n
    if not shared and not static:
        return None
    if static:
        out = StaticCache(config=model.config, max_cache_len=max_len)
        if any(type(layer) is not StaticLayer for layer in out.layers):
            return None
        if not shared:
            return out  # generate prefills it like any cache
    prefix = dynamic_prefix_cache(model)
    attn = mask[first, : p - 1].long()
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)  # as generate numbers left-padded rows
    model(input_ids=ids[first, : p - 1], attention_mask=attn, position_ids=position_ids, use_cache=True,
          logits_to_keep=1, **{cache_kwarg(model.forward): prefix})  # (U, heads, P-1, d) per layer
    if not static:
        prefix.batch_select_indices(inverse)  # (U, ...) -> (n, ...)
        return prefix
    for layer, src in zip(out.layers, prefix.layers):
        layer.update(src.keys[inverse], src.values[inverse])  # written in place at positions 0 … P-2
    return out


_SAMPLERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _sampler_copy(model: Any, dtype: torch.dtype) -> Any:
    """A copy of ``model`` whose floating-point *parameters* are ``dtype`` (buffers such as rotary
    frequencies stay as they are), with the weights of ``model`` right now. Made once per model and
    dtype, refreshed in place on every call (a cast-copy of the weights)."""
    if all(p.dtype == dtype for p in model.parameters() if p.is_floating_point()):
        return model
    per_model = _SAMPLERS.setdefault(model, {})
    copy = per_model.get(dtype)
    if copy is None:
        import copy as copy_mod

        with torch.inference_mode(False):  # normal tensors, so later refreshes work in or out of it
            copy = copy_mod.deepcopy(model).requires_grad_(False)
            for p in copy.parameters():
                if p.is_floating_point():
                    p.data = p.data.to(dtype)
        per_model[dtype] = copy
    with torch.no_grad():
        for src, dst in zip(model.parameters(), copy.parameters()):
            dst.copy_(src)
    copy.generation_config = model.generation_config  # generate fills unset fields from it
    return copy


def _model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch's RNGs for the block and restore the caller's RNG state afterwards."""
    if seed is None:
        yield
        return
    accel = device.type != "cpu"
    devices = [device.index if device.index is not None else 0] if accel else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if accel else "cuda"):
        torch.manual_seed(seed)
        yield


def _warn_on_model_overrides(model: Any) -> None:
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return
    set_fields = [f for f in _NONE_ONLY_FIELDS if getattr(gen, f, None) is not None]
    if set_fields:
        warnings.warn(
            f"model.generation_config sets {set_fields}; transformers applies these on top of the "
            "sampling recipe (they cannot be switched off from an explicit GenerationConfig). "
            "Clear them on model.generation_config to sample from the recipe alone.",
            stacklevel=3,
        )
