"""Put :mod:`grpokit.ops` into a transformers model (``model.fused_ops``, on by default).

``apply_fused_ops(model)`` replaces, on the instances, the ``forward`` of the RMSNorm and gated-MLP
modules of Llama, Mistral, Qwen2 and Qwen3 models; marks the model so that
:func:`grpokit.policy.completion_logprobs` takes its log-probs with
:func:`grpokit.ops.linear_token_logprobs` from the decoder's hidden states instead of the full
logits; switches transformers' ``sdpa`` attention to :mod:`grpokit.attention` (grouped KV
heads not repeated); and gives the input embedding a sparse weight gradient
(:func:`grpokit.ops.embedding`). Each module class is checked once, on a random input, to give the original
forward's values before it is replaced (a transformers release that changed the formula is left
alone).

Measured on SmolLM2-135M in bf16, one 8-row micro-batch sharing a 100-token prompt, 64 completion
tokens: the tensors autograd keeps for the backward go from 609 MB to ~175 MB, and the benchmark's
peak resident memory from 3.1 to 2.3 GB, at the same step time (``tests/test_fused.py`` pins the
values, ``bench/`` the speed and memory).

The replaced forwards defer to the original one when no gradient is being recorded (generation,
reference passes: nothing would be saved) and under autocast (the plain path handles its casts).
"""

from __future__ import annotations

import types

import torch

from grpokit import attention
from grpokit.ops import embedding, rms_norm, swiglu_mlp

_NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}
_MLPS = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"}
#: model types whose causal-LM logits are exactly ``lm_head(decoder(...).last_hidden_state)``
_PLAIN_HEAD_TYPES = {"llama", "mistral", "qwen2", "qwen3"}
_MARK = "_grpokit_fused_ops"
_RECOMPUTE = "_grpokit_recompute_mlp"  # on a switched MLP module: swiglu_mlp(recompute=...)


def _plain(x: torch.Tensor) -> bool:
    return not torch.is_grad_enabled() or torch.is_autocast_enabled(x.device.type)


def _norm_forward(self, hidden_states):
    if _plain(hidden_states):
        return type(self).forward(self, hidden_states)
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self, x):
    if _plain(x):
        return type(self).forward(self, x)
    return swiglu_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                      recompute=getattr(self, _RECOMPUTE, True))


def _embedding_forward(self, input):
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
    """The input embedding's backward gives a sparse gradient (:func:`grpokit.ops.embedding`)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if (type(emb) is not torch.nn.Embedding or emb.max_norm is not None or emb.scale_grad_by_freq or emb.sparse
            or "forward" in vars(emb)):
        return 0
    emb.forward = types.MethodType(_embedding_forward, emb)
    return 1


def _eligible_mlp(m: torch.nn.Module) -> bool:
    act = getattr(getattr(m, "config", None), "hidden_act", None)
    linears = [getattr(m, k, None) for k in ("gate_proj", "up_proj", "down_proj")]
    return act in ("silu", "swish") and all(isinstance(lin, torch.nn.Linear) and lin.bias is None
                                            for lin in linears)


def _same_as_original(m: torch.nn.Module, new_forward, width: int) -> bool:
    """Both forwards on one random ``(2, 3, width)`` input, with gradient recording on."""
    p = next(m.parameters())
    x = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(p.device, p.dtype)
    with torch.enable_grad():
        want, got = type(m).forward(m, x), new_forward(m, x)
    tol = 1e-5 if p.dtype == torch.float32 else 2e-2
    return want.shape == got.shape and torch.allclose(want.float(), got.float(), rtol=tol, atol=tol)


def apply_fused_ops(model: torch.nn.Module, *, recompute_mlp: bool = True) -> dict[str, int]:
    """Use the memory-lean ops in ``model`` (in place); see the module docstring.

    Args:
        model: a transformers causal LM.
        recompute_mlp: the MLP's backward runs its ``gate`` and ``up`` matmuls again (True) or
            uses the two ``(tokens, intermediate)`` outputs kept from the forward (False: more
            activation memory, less time; :func:`grpokit.ops.swiglu_mlp`).

    Returns:
        how many modules were switched: ``{"rms_norm": n, "mlp": n, "head": 0|1, "attention": 0|1,
        "embedding": 0|1}`` (attention: a model on transformers' ``sdpa`` now uses
        :mod:`grpokit.attention`; embedding: the input embedding's weight gets a sparse gradient,
        :func:`grpokit.ops.embedding`). All zero for an architecture outside the list above (it
        then runs as before).
    """
    counts = {"rms_norm": 0, "mlp": 0, "head": 0, "attention": 0, "embedding": 0}
    checked: dict[type, bool] = {}  # per class (two classes may share a name)
    for m in model.modules():
        name = type(m).__name__
        if name in _NORMS and hasattr(m, "variance_epsilon"):
            new, key, width = _norm_forward, "rms_norm", m.weight.shape[0]
        elif name in _MLPS and _eligible_mlp(m):
            new, key, width = _mlp_forward, "mlp", m.gate_proj.in_features
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
    if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attention.register())
        counts["attention"] = int(config._attn_implementation == attention.NAME)
    return counts


def fused_head(model: torch.nn.Module, *, mark_required: bool = True):
    """``(decoder, head_weight)`` if ``model``'s log-probs may be taken with
    :func:`grpokit.ops.linear_token_logprobs` (a marked model of a listed type whose head is a
    bias-free ``Linear``), else None."""
    if mark_required and not getattr(model, _MARK, False):
        return None
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _PLAIN_HEAD_TYPES:
        return None
    decoder = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Linear) or head.bias is not None:
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
        model.set_attn_implementation("sdpa")
