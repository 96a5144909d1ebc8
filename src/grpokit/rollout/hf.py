"""Rollouts with Hugging Face ``model.generate`` (CPU or one GPU).

``generate_rollouts`` samples ``G`` completions for each of ``B`` prompts:

1. tokenize the prompts as given (already formatted for the model) with exactly one BOS where
   the tokenizer adds one (:func:`grpokit.models.loading.encode_prompts`), left-padded to a common ``P``;
2. repeat each prompt ``G`` times (``repeat_interleave``), so the ``N = B·G`` rows are grouped:
   rows ``b·G … b·G+G-1`` are prompt ``b``'s group;
3. one batched ``model.generate`` call over all rows (or over chunks of ``chunk_size`` rows, padded
   to a common completion length ``T`` afterwards), under ``torch.inference_mode()``, with an
   explicit ``GenerationConfig`` built from the recipe's :class:`SamplingParams`;
4. ``completion_mask`` from ``grpokit.algo.mask_completions`` (True up to and including the first
   EOS, never derived from the pad id), ``truncated`` = no EOS within ``max_new_tokens``;
5. decode each completion up to (excluding) its first EOS, skipping special tokens.

Speed (each switchable, none changes the sampling rule; ``tests/models/test_policy_fast.py`` checks that
the fast paths sample the same tokens as the plain one on a tiny model). The prefix cache and the
packed weights are the model's backend's (:func:`grpokit.backends.get_backend`): a model with the
``cpu`` backend gets them, one with ``plain`` (or none installed) runs ``generate`` as it comes:

- ``share_prompt=True`` (default; cpu backend): ``generate`` would run the prefill over all
  ``N = B·G`` rows, i.e. each prompt G times. Instead the first ``P-1`` prompt columns of each
  *distinct* prompt in a chunk run once; their KV cache is repeated to the rows and handed to
  ``generate``, which then only runs the last prompt column before sampling.
- ``static_cache=True`` (default; cpu backend): that cache is a preallocated ``StaticCache`` of
  ``P + max_new_tokens`` positions written in place, instead of a ``DynamicCache`` that
  concatenates (copies) every layer's whole cache at every new token; on CPU the copies cost about
  a third of a decode step. No ``torch.compile`` is involved (``disable_compile=True``).
- ``sampler_dtype=torch.bfloat16``: sample from a bf16 copy of the weights (made once, refreshed
  from the model at every call), for the bf16 setting (``model.autocast_bf16``) where the trainer
  scores in bf16 too. Decode steps on CPU are bound by reading the weights; bf16 halves that.
- ``packed_weights=True`` (default; cpu backend): the linear layers run on copies of their weights
  packed once per call for oneDNN (:mod:`grpokit.backends.cpu.packed`) instead of being re-packed by
  the BLAS library at every decode step: 0.27 → 0.20 ms per 576×1536 layer in bf16 at 32 rows,
  0.64 → 0.34 ms in float32. bf16 logits are bit-identical; float32 ones differ by summation order.
- ``SamplingParams.sampler="inverse_cdf"`` (default): the next token is drawn by a logits
  processor with one uniform number per row (:mod:`grpokit.rollout.sampling`) instead of
  ``torch.multinomial`` (one exponential number per vocabulary entry: ~33 ms of a ~130 ms decode
  step for 32 rows × 49k entries). Same distribution, different draws for a seed.

Sampling replay: with a truncating warper (``top_k``/``top_p``/``min_p``, :attr:`SamplingParams.truncates`)
and the inverse-CDF sampler, the experience also carries ``sampler_support`` ``(N, T, W)``, the set
each token was drawn from as the sampler had it (:mod:`grpokit.algo.support`; empty after the first
EOS), and ``sampler_logprobs`` ``(N, T)``, the sampler's log-prob of each token over that set (0
after the first EOS). The trainer renormalizes π_old, π_θ and π_ref over the same sets
(docs/design.md, "Temperature"). ``sampler="multinomial"`` records nothing (``generate`` applies its
own warpers after every processor passed in, so the set is not seen; training refuses the pair).

Seeding: with ``seed`` and the inverse-CDF sampler, row ``(b, g)`` draws its ``max_new_tokens``
uniform numbers from a generator seeded :func:`grpokit.rollout.engine.request_seed` ``(seed,
first_prompt + b, g)`` (a table made once per call, :func:`grpokit.rollout.sampling.request_uniforms`),
so its completion does not depend on ``chunk_size`` or on which prompts share the call: a batch split
across calls (or ranks) with ``first_prompt`` offsets samples what one call samples. With
``sampler="multinomial"`` ``generate`` draws from torch's global RNG seeded by ``seed`` once per
call, so its draws depend on the batch and its chunking.

The model's own ``generation_config`` (which may carry ``top_p``, ``temperature``, ``top_k``,
``max_length`` from the hub) never overrides the recipe: transformers fills every field left
``None`` from it, so :func:`build_generation_config` sets each sampling field explicitly, including
the "off" values (``top_k=0``, ``min_p=0.0``, ``top_p=1.0``).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.algo import completion_terminated, mask_completions
from grpokit.backends import get_backend, model_device
from grpokit.experience import Experience
from grpokit.rollout.engine import SamplingParams, check_prompts
from grpokit.rollout.sampler_copy import sampler_copy

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


def sampling_processors(params: SamplingParams, uniforms: torch.Tensor | None = None) -> list[Any]:
    """The ``logits_processor`` list one ``generate`` call needs for ``params`` with the config of
    :func:`build_generation_config`: ``[InverseCDFSampler]`` when it samples by inverse CDF (recording
    its kept sets when ``params`` truncates: :func:`records_support`), else empty (``generate``
    samples or decodes greedily by itself). ``uniforms``: the call's rows of the uniform-number
    table (``(n, max_new_tokens)``), or None for torch's global RNG."""
    if _inverse_cdf(params):
        from grpokit.rollout.sampling import InverseCDFSampler

        return [
            InverseCDFSampler(
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                min_p=params.min_p,
                uniforms=uniforms,
                record=records_support(params),
            )
        ]
    return []


def _inverse_cdf(params: SamplingParams) -> bool:
    return params.temperature > 0 and params.sampler == "inverse_cdf"


def records_support(params: SamplingParams) -> bool:
    """Whether sampling with ``params`` records ``sampler_support`` and ``sampler_logprobs``
    (sampling replay): a truncating warper on (:attr:`SamplingParams.truncates`) and the
    inverse-CDF sampler, the one that sees the warped scores."""
    return params.truncates and _inverse_cdf(params)


@dataclass
class Generated:
    """One ``generate`` call's new tokens ``(n, T_c)`` and, when it recorded them (sampling
    replay), each token's kept set ``(n, T_c, W)`` and the sampler's log-prob of it ``(n, T_c)``
    (for every decode step, finished rows included: the caller clears what follows an end)."""

    tokens: torch.Tensor
    support: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None


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
    first_prompt: int = 0,
    share_prompt: bool = True,
    static_cache: bool = True,
    sampler_dtype: torch.dtype | None = None,
    packed_weights: bool = True,
) -> Experience:
    """Sample ``group_size`` completions for each prompt with ``model.generate``.

    Args:
        model: a Hugging Face causal LM (train/eval mode is left as is; generation runs under
            ``torch.inference_mode()``).
        tokenizer: its tokenizer, with a pad token (see ``grpokit.models.loading.load_tokenizer``).
            Prompts are always padded on the left, whatever ``tokenizer.padding_side`` says.
        prompts: ``B`` prompt strings, already formatted for the model (chat-templated or plain);
            encoded by :func:`grpokit.models.loading.encode_prompts` (one BOS where the model expects one).
        group_size: ``G >= 1`` completions per prompt.
        params: the sampling recipe; the model's ``generation_config`` cannot override it.
        eos_token_ids: every id that ends a completion (``grpokit.models.loading.eos_token_ids``).
        chunk_size: generate at most this many rows per ``generate`` call (memory bound); the
            chunks are right-padded with the pad id to a common ``T``. ``None`` = all ``N`` rows.
        seed: if given, the output is reproducible and the caller's global RNG state is left
            untouched. Inverse CDF: row ``(b, g)`` draws from a generator seeded
            ``request_seed(seed, first_prompt + b, g)`` (module docstring), whatever the chunking
            or the other prompts of the call. Multinomial: torch's global RNG is seeded with
            ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (draws depend on the
            batch). Pass a different seed per step. None: torch's global RNG as it is.
        first_prompt: the index of ``prompts[0]`` in the step's batch (``>= 0``): prompt ``b`` is
            seeded as prompt ``first_prompt + b``, so calls over consecutive slices of a batch give
            the rows of one call over all of it.
        share_prompt: prefill each distinct prompt once and repeat its KV cache to its G rows
            (module docstring; cpu backend); False = plain ``generate`` over all rows.
        static_cache: preallocated KV cache written in place (module docstring; cpu backend);
            False = the ``DynamicCache`` ``generate`` builds by default.
        sampler_dtype: ``None`` = sample with ``model`` as it is; a float dtype (bf16) = sample
            with a copy of its weights in that dtype, refreshed from ``model`` on every call.
        packed_weights: run the linear layers on weights packed once for oneDNN (module
            docstring; cpu backend, CPU weights only); False = ``F.linear`` on the plain weights.

    Returns:
        :class:`~grpokit.experience.Experience` with ``N = B·G`` rows grouped by prompt
        (``group_index``), ``T <= max_new_tokens``, ``truncated``, ``completions`` and ``gen_s`` set;
        with a truncating warper and the inverse-CDF sampler also ``sampler_support`` and
        ``sampler_logprobs`` (module docstring, "Sampling replay").

    Raises:
        ValueError: ``group_size < 1``; ``prompts`` empty, not a list of strings, or containing an
            empty prompt; ``params.max_new_tokens < 1`` (or another field out of range);
            ``eos_token_ids`` empty; ``chunk_size < 1``; ``first_prompt`` not an int >= 0; the
            tokenizer has no pad token.
    """
    check_prompts(prompts, group_size, first_prompt)
    params.validate()
    eos = [int(i) for i in eos_token_ids]
    if not eos:
        raise ValueError("eos_token_ids is empty; pass at least one EOS id")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size!r}")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("tokenizer has no pad token; load it with grpokit.models.loading.load_tokenizer")
    _warn_on_model_overrides(model)

    device = model_device(model)
    ids_b, mask_b = left_padded_prompts(tokenizer, prompts, pad_id)  # (B, P)
    G = group_size
    prompt_ids = ids_b.repeat_interleave(G, dim=0).to(device)  # (N, P)
    prompt_mask = mask_b.repeat_interleave(G, dim=0).to(device)  # (N, P)
    group_index = torch.arange(len(prompts), device=device).repeat_interleave(G)  # (N,)
    N, P = prompt_ids.shape
    rows = N if chunk_size is None else chunk_size

    gen_config = build_generation_config(
        params, eos_token_ids=eos, pad_token_id=pad_id, bos_token_id=tokenizer.bos_token_id
    )
    uniforms = None  # (N, max_new_tokens): row (b, g) from request_seed(seed, first_prompt + b, g)
    if seed is not None and _inverse_cdf(params):
        from grpokit.rollout.sampling import request_uniforms

        uniforms = request_uniforms(seed, first_prompt, len(prompts), G, params.max_new_tokens).to(device)
    t0 = time.perf_counter()
    chunks = _generate_chunks(
        model,
        prompt_ids,
        prompt_mask,
        params,
        gen_config,
        uniforms,
        rows=rows,
        seed=seed,
        share_prompt=share_prompt,
        static_cache=static_cache,
        sampler_dtype=sampler_dtype,
        packed_weights=packed_weights,
    )
    gen_s = time.perf_counter() - t0
    return _experience(
        prompt_ids, prompt_mask, group_index, G, chunks, eos=eos, pad_id=pad_id, tokenizer=tokenizer, gen_s=gen_s
    )


def _generate_chunks(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    gen_config: Any,
    uniforms: torch.Tensor | None,
    *,
    rows: int,
    seed: int | None,
    share_prompt: bool,
    static_cache: bool,
    sampler_dtype: torch.dtype | None,
    packed_weights: bool,
    stopping: Callable[[int], Any] | None = None,
    prefix: int | None = None,
) -> list[Generated]:
    """``generate`` over consecutive chunks of ``rows`` rows: each chunk's new tokens ``(n, T_chunk)``
    (and, sampling with a truncating warper, what its sampler recorded: :class:`Generated`), under
    the model's backend (its prefill and generation context), a fresh sampler per chunk holding the
    chunk's rows of ``uniforms``. ``stopping``: ``(prompt width) -> StoppingCriteria`` ending a row
    early (a multi-turn rollout's stop strings), or None. ``prefix``: the leading columns the
    backend's prefill may share between rows (``Backend.prefill``)."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    N, P = prompt_ids.shape
    backend = get_backend(model)  # the sampler copy runs under the policy's backend
    chunks: list[Generated] = []
    with torch.inference_mode(), _seeded(seed, model_device(model)):
        sampler = model if sampler_dtype is None else sampler_copy(model, sampler_dtype)
        with backend.generation(sampler, rows, packed_weights=packed_weights):
            for start in range(0, N, rows):
                ids = prompt_ids[start : start + rows]
                mask = prompt_mask[start : start + rows]
                extra = backend.prefill(
                    sampler,
                    ids,
                    mask,
                    share=share_prompt,
                    static=static_cache,
                    max_len=P + params.max_new_tokens,
                    prefix=prefix,
                )
                # a fresh sampler per generate call (it counts its calls: decode steps), with its rows' uniforms
                processors = sampling_processors(params, None if uniforms is None else uniforms[start : start + rows])
                extra_gen: dict[str, Any] = {"logits_processor": LogitsProcessorList(processors)} if processors else {}
                if stopping is not None:
                    extra_gen["stopping_criteria"] = StoppingCriteriaList([stopping(P)])
                # synced_gpus=False: transformers would step every rank in lockstep for an FSDP
                # model; here its weights are gathered (grpokit.utils.distributed.gathered), so each rank
                # (or rank 0 alone, evaluating) decodes on its own
                out = sampler.generate(
                    input_ids=ids,
                    attention_mask=mask.long(),
                    generation_config=gen_config,
                    synced_gpus=False,
                    **extra,
                    **extra_gen,
                )
                new = out[:, P:]  # (n, T_chunk): generate returns prompt + new tokens
                if processors and processors[0].record:
                    support, logprobs = processors[0].recorded()  # one call per new token
                    chunks.append(Generated(new, support, logprobs))
                else:
                    chunks.append(Generated(new))
    return chunks


def _experience(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    group_index: torch.Tensor,
    group_size: int,
    chunks: list[Generated],
    *,
    eos: list[int],
    pad_id: int,
    tokenizer: Any,
    gen_s: float,
) -> Experience:
    """The chunks' tokens right-padded to one ``(N, T)`` with ``pad_id``, masked up to and including
    the first EOS, decoded; an :class:`Experience` of the prompts and these completions (with the
    chunks' recorded supports and log-probs, emptied / 0 past the first EOS, when they have them)."""
    # A chunk shorter than the longest stopped early because all its rows hit EOS, so padding
    # it on the right never hides a truncation.
    N, device = prompt_ids.shape[0], prompt_ids.device
    T = max(c.tokens.shape[1] for c in chunks)
    completion_ids = torch.full((N, T), pad_id, dtype=torch.long, device=device)  # (N, T)
    start = 0
    for c in chunks:
        completion_ids[start : start + c.tokens.shape[0], : c.tokens.shape[1]] = c.tokens
        start += c.tokens.shape[0]
    completion_mask = mask_completions(completion_ids, eos)  # (N, T)
    sampler_support, sampler_logprobs = _replay_fields(chunks, T, completion_mask)
    truncated = ~completion_terminated(completion_ids, eos)  # (N,)
    n_text = completion_mask.sum(1) - (~truncated).long()  # tokens before the first EOS
    completions = tokenizer.batch_decode(
        [ids[:n].tolist() for ids, n in zip(completion_ids, n_text.tolist())],
        skip_special_tokens=True,
    )
    return Experience(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        group_index=group_index,
        group_size=group_size,
        truncated=truncated,
        completions=completions,
        gen_s=gen_s,
        sampler_support=sampler_support,
        sampler_logprobs=sampler_logprobs,
    )


def _replay_fields(
    chunks: list[Generated], t: int, completion_mask: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(sampler_support, sampler_logprobs)`` of the chunks joined over rows, padded to ``t``
    positions, empty / 0 where ``completion_mask`` is False (finished rows' steps and padding), or
    ``(None, None)`` when the chunks recorded nothing."""
    from grpokit.algo import support as sup

    if chunks[0].support is None:
        return None, None
    supports = sup.unify([c.support for c in chunks if c.support is not None])
    support = torch.cat([sup.pad_positions(s, t) for s in supports])  # (N, T, W)
    logp = torch.cat(
        [torch.nn.functional.pad(c.logprobs, (0, t - c.logprobs.shape[1])) for c in chunks if c.logprobs is not None]
    )  # (N, T)
    return sup.cleared(support, ~completion_mask), logp.masked_fill(~completion_mask, 0.0)


def left_padded_prompts(tokenizer: Any, prompts: Sequence[str], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both ``(B, P)``: the prompts encoded by :func:`grpokit.models.loading.encode_prompts`
    (one BOS where the model expects one), left-padded with ``pad_id``; ``mask`` (bool) is True on
    real tokens.

    Raises:
        ValueError: a prompt encodes to no tokens (names its index).
    """
    from grpokit.models.loading import encode_prompts

    encoded = encode_prompts(tokenizer, list(prompts))
    for i, x in enumerate(encoded):
        if not x:
            raise ValueError(f"prompts[{i}] tokenizes to no tokens")
    return left_padded(encoded, pad_id)


def left_padded(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both ``(n, L)`` (``L`` the longest of ``seqs``): the id lists left-padded with
    ``pad_id``; ``mask`` (bool) True on real tokens.

    >>> ids, mask = left_padded([[5, 6], [7]], 0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [0, 7]], [[True, True], [False, True]])
    """
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, x in enumerate(seqs):
        ids[i, width - len(x) :] = torch.tensor(list(x), dtype=torch.long)
        mask[i, width - len(x) :] = True
    return ids, mask


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch's RNGs for the block and restore the caller's RNG state afterwards (the
    multinomial sampler draws from them; the inverse-CDF one, given a seed, from its table)."""
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
