"""Put :mod:`.ops` into a transformers model (the ``cpu`` backend's install step).

``apply_fused_ops(model)`` replaces, on the instances, the ``forward`` of the modules whose
structure is one the ops compute exactly: an RMSNorm (a leaf module with a 1-D ``weight``, a float
``variance_epsilon``/``eps`` and no bias) and a gated MLP (``gate_proj``, ``up_proj``, ``down_proj``
all exactly ``torch.nn.Linear`` without bias, a SiLU ``act_fn``); marks the model so that
:class:`grpokit.backends.cpu.CpuBackend` takes its log-probs with :func:`.ops.linear_token_logprobs`
from the decoder's hidden states instead of the full logits (Llama, Mistral, Qwen2, Qwen3: the
model types whose logits are exactly ``lm_head(decoder(...))``); switches transformers' ``sdpa``
attention to :mod:`.attention` (grouped KV heads not repeated); and gives the input embedding a
sparse weight gradient (:func:`.ops.embedding`). Each module class is checked once, on a random
input, to give the original forward's values before it is replaced (a module of that shape
computing another formula, e.g. Gemma's ``(1 + w)`` gain, is left alone). A module wrapped later
(e.g. peft's LoRA layers in place of a projection) is seen at call time: the MLP then runs its own
forward.

Measured on SmolLM2-135M in bf16, one 8-row micro-batch sharing a 100-token prompt, 64 completion
tokens: the tensors autograd keeps for the backward go from 609 MB to ~175 MB, and the benchmark's
peak resident memory from 3.1 to 2.3 GB, at the same step time (``tests/backends/cpu/test_fused.py``
pins the values, ``bench/`` the speed and memory).

The replaced forwards defer to the original one when no gradient is being recorded (generation,
reference passes: nothing would be saved), under autocast (the plain path handles its casts) and
for tensors off the CPU.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, cast

import torch

from grpokit.backends.cpu import attention
from grpokit.backends.cpu.ops import embedding, rms_norm, swiglu_mlp

#: model types whose causal-LM logits are exactly ``lm_head(decoder(...).last_hidden_state)``
_PLAIN_HEAD_TYPES = {"llama", "mistral", "qwen2", "qwen3"}
_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_MARK = "_grpokit_fused_ops"
_RECOMPUTE = "_grpokit_recompute_mlp"  # on a switched MLP module: swiglu_mlp(recompute=...)


def _method(model: torch.nn.Module, name: str) -> Callable[..., Any]:
    """``model.<name>``, a method of a transformers model: typed (nn.Module's ``__getattr__`` types
    every attribute ``Tensor | Module``)."""
    return cast(Callable[..., Any], getattr(model, name))


def _plain(x: torch.Tensor) -> bool:
    return not torch.is_grad_enabled() or x.device.type != "cpu" or torch.is_autocast_enabled(x.device.type)


def _norm_eps(m: torch.nn.Module) -> Any:
    """The norm's epsilon: transformers' ``variance_epsilon`` or ``torch.nn.RMSNorm``'s ``eps``
    (whatever the attribute holds, None without one: :func:`eligible_norm` checks it is a float)."""
    return getattr(m, "variance_epsilon", getattr(m, "eps", None))


def _norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    if _plain(hidden_states):
        return type(self).forward(self, hidden_states)
    return rms_norm(hidden_states, cast(torch.Tensor, self.weight), _norm_eps(self))


def _plain_projections(m: torch.nn.Module) -> bool:
    """``gate_proj``, ``up_proj``, ``down_proj`` are each exactly ``torch.nn.Linear`` (a subclass
    or a wrapper, e.g. peft's LoRA layer, may compute something else) without bias."""
    for key in _PROJECTIONS:
        lin = getattr(m, key, None)
        if type(lin) is not torch.nn.Linear or lin.bias is not None:
            return False
    return True


def _mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if _plain(x) or not _plain_projections(self):  # checked per call: a wrapper may come later
        return type(self).forward(self, x)
    return swiglu_mlp(
        x,
        cast(torch.nn.Linear, self.gate_proj).weight,  # exactly nn.Linear: _plain_projections
        cast(torch.nn.Linear, self.up_proj).weight,
        cast(torch.nn.Linear, self.down_proj).weight,
        recompute=getattr(self, _RECOMPUTE, True),
    )


def _embedding_forward(self: torch.nn.Embedding, input: torch.Tensor) -> torch.Tensor:
    if _plain(input):
        return type(self).forward(self, input)
    weight = self.weight
    if isinstance(weight, torch.nn.Parameter) and weight.requires_grad:
        _densify_hooks(weight, add=True)  # here, not when switching: a deepcopy drops tensor hooks
    return embedding(input, weight, self.padding_idx)


def _densify_grad(param: torch.Tensor) -> None:
    """Post-accumulate hook of the embedding weight: a ``.grad`` left sparse (an untied embedding,
    whose gradient nothing dense was added to) becomes dense, as optimizers and clipping expect."""
    if param.grad is not None and param.grad.layout != torch.strided:
        param.grad = param.grad.to_dense()


def _densify_hooks(param: torch.Tensor, *, add: bool) -> None:
    """Make sure ``param`` has the :func:`_densify_grad` hook once (``add``), or has none."""
    hooks = param._post_accumulate_grad_hooks or {}
    ours = [k for k, fn in hooks.items() if fn is _densify_grad]
    if add and not ours:
        param.register_post_accumulate_grad_hook(_densify_grad)
    elif not add:
        for k in ours:
            del hooks[k]


def _switch_embedding(model: torch.nn.Module) -> int:
    """The input embedding's backward gives a sparse gradient (:func:`.ops.embedding`)."""
    emb = _method(model, "get_input_embeddings")() if hasattr(model, "get_input_embeddings") else None
    if (
        type(emb) is not torch.nn.Embedding
        or emb.max_norm is not None
        or emb.scale_grad_by_freq
        or emb.sparse
        or "forward" in vars(emb)
    ):
        return 0
    emb.forward = types.MethodType(_embedding_forward, emb)  # type: ignore[method-assign]  # on the instance
    return 1


def _is_silu(act: object) -> bool:
    if isinstance(act, torch.nn.SiLU):
        return True
    try:
        from transformers.activations import SiLUActivation
    except ImportError:  # pragma: no cover - older transformers map silu to torch.nn.SiLU
        return False
    return isinstance(act, SiLUActivation)


def eligible_mlp(m: torch.nn.Module) -> bool:
    """A gated MLP the fused op computes: plain bias-free projections (:func:`_plain_projections`)
    and a SiLU ``act_fn`` (``torch.nn.SiLU`` or transformers' ``SiLUActivation``)."""
    return _plain_projections(m) and _is_silu(getattr(m, "act_fn", None))


def eligible_norm(m: torch.nn.Module) -> bool:
    """RMSNorm-shaped: a leaf module with a 1-D ``weight`` parameter, a float epsilon
    (``variance_epsilon`` or ``eps``) and no bias. Whether it computes RMSNorm's formula is checked
    on a random input (:func:`_same_as_original`)."""
    w = getattr(m, "weight", None)
    eps = _norm_eps(m)
    return (
        isinstance(w, torch.nn.Parameter)
        and w.dim() == 1
        and isinstance(eps, (float, int))
        and not isinstance(eps, bool)
        and getattr(m, "bias", None) is None
        and next(m.children(), None) is None
    )


def _same_as_original(
    m: torch.nn.Module, new_forward: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor], width: int
) -> bool:
    """Both forwards on one random ``(2, 3, width)`` input, with gradient recording on (False if
    either raises: a module of that shape with another signature)."""
    p = next(m.parameters())
    if p.device.type != "cpu":  # the replaced forward would defer to the original there
        return False
    x = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(p.device, p.dtype)
    try:
        with torch.enable_grad():
            want, got = type(m).forward(m, x), new_forward(m, x)
    except Exception:
        return False
    tol = 1e-5 if p.dtype == torch.float32 else 2e-2
    return (
        isinstance(want, torch.Tensor)
        and want.shape == got.shape
        and torch.allclose(want.float(), got.float(), rtol=tol, atol=tol)
    )


def apply_fused_ops(model: torch.nn.Module, *, recompute_mlp: bool = True) -> dict[str, int]:
    """Use the memory-lean ops in ``model`` (in place); see the module docstring.

    Args:
        model: a transformers causal LM.
        recompute_mlp: the MLP's backward runs its ``gate`` and ``up`` matmuls again (True) or
            uses the two ``(tokens, intermediate)`` outputs kept from the forward (False: more
            activation memory, less time; :func:`.ops.swiglu_mlp`).

    Modules are chosen by structure (:func:`eligible_norm`, :func:`eligible_mlp`), not by class
    name, and each class is checked once against its own forward before it is replaced.

    Returns:
        how many modules were switched: ``{"rms_norm": n, "mlp": n, "head": 0|1, "attention": 0|1,
        "embedding": 0|1}`` (attention: a model on transformers' ``sdpa`` now uses
        :mod:`.attention`; embedding: the input embedding's weight gets a sparse gradient,
        :func:`.ops.embedding`). All zero for a model with none of these structures (it then runs
        as before).
    """
    counts = {"rms_norm": 0, "mlp": 0, "head": 0, "attention": 0, "embedding": 0}
    checked: dict[type, bool] = {}  # per class (two classes may share a name)
    new: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    for m in model.modules():
        if "forward" in vars(m):  # already switched (or replaced by someone else): leave it
            continue
        if eligible_norm(m):
            new, key, width = _norm_forward, "rms_norm", cast(torch.Tensor, m.weight).shape[0]
        elif eligible_mlp(m):
            new, key, width = _mlp_forward, "mlp", cast(torch.nn.Linear, m.gate_proj).in_features
        else:
            continue
        if type(m) not in checked:
            checked[type(m)] = _same_as_original(m, new, width)
        if checked[type(m)]:
            m.forward = types.MethodType(new, m)
            counts[key] += 1
            if key == "mlp":
                setattr(m, _RECOMPUTE, recompute_mlp)
    if fused_head(model, mark_required=False) is not None:
        setattr(model, _MARK, True)
        counts["head"] = 1
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) in _PLAIN_HEAD_TYPES:
        counts["embedding"] = _switch_embedding(model)
    if (
        config is not None
        and getattr(config, "_attn_implementation", None) == "sdpa"
        and hasattr(model, "set_attn_implementation")
    ):
        _method(model, "set_attn_implementation")(attention.register())
        counts["attention"] = int(config._attn_implementation == attention.NAME)
    return counts


def fused_head(model: torch.nn.Module, *, mark_required: bool = True) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """``(decoder, head_weight)`` if ``model``'s log-probs may be taken with
    :func:`.ops.linear_token_logprobs` (a marked model of a listed type whose head is exactly a
    bias-free ``torch.nn.Linear``), else None. Checked at every call: a head wrapped later (LoRA)
    gets the plain logits."""
    if mark_required and not getattr(model, _MARK, False):
        return None
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _PLAIN_HEAD_TYPES:
        return None
    decoder = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    head = _method(model, "get_output_embeddings")() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(decoder, torch.nn.Module) or type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    return decoder, head.weight


def remove_fused_ops(model: torch.nn.Module) -> None:
    """Undo :func:`apply_fused_ops` on ``model`` (in place): the original forwards, no fused head,
    transformers' ``sdpa`` attention. For comparisons with the plain path (``bench/``)."""
    for m in model.modules():
        func = getattr(vars(m).get("forward"), "__func__", None)
        if func is _embedding_forward and isinstance(m.weight, torch.Tensor):
            _densify_hooks(m.weight, add=False)
        if func in (_norm_forward, _mlp_forward, _embedding_forward):
            del m.forward
        if _RECOMPUTE in vars(m):
            delattr(m, _RECOMPUTE)
    if getattr(model, _MARK, False):
        delattr(model, _MARK)
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == attention.NAME:
        _method(model, "set_attn_implementation")("sdpa")
