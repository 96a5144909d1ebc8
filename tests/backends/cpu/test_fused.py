"""The cpu backend's fused ops (``grpokit.backends.cpu.fused``): a model with ``model.backend=cpu``
gives the plain backend's log-probs, entropies, loss and gradients, samples the same tokens, and
keeps fewer bytes for the backward; modules are switched by structure. Tiny random Llama with
grouped KV heads (4 query heads, 2 KV heads), float32."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.models.test_policy_fast import V, _grouped_batch, _loss_and_grads

from grpokit import algo
from grpokit.backends import backend_of, install_backend
from grpokit.backends.cpu.fused import apply_fused_ops, fused_head
from grpokit.models.logprobs import batch_logprobs, completion_logprobs
from support.helpers import saved_bytes

GQA = dict(vocab_size=V, pad_token_id=0, num_attention_heads=4, num_key_value_heads=2)


def _cpu(model, **options):
    """``model`` with the cpu backend installed (in place); returns what it switched."""
    install_backend(model, "cpu", announce=False, **options)
    return model._grpokit_backend.switched


def _pair(make_tiny_model, recompute_mlp=True, **overrides):
    plain = make_tiny_model(**(GQA | overrides))
    fused = copy.deepcopy(plain)
    return plain, fused, _cpu(fused, recompute_mlp=recompute_mlp)


def test_apply_switches_every_norm_mlp_the_head_and_attention(make_tiny_model):
    plain, fused, counts = _pair(make_tiny_model)
    layers = plain.config.num_hidden_layers
    assert counts == {"rms_norm": 2 * layers + 1, "mlp": layers, "head": 1, "attention": 1, "embedding": 1}
    assert fused.config._attn_implementation == "grpokit_sdpa"
    assert fused_head(fused) is not None and fused_head(plain) is None  # only a prepared model
    assert backend_of(fused) == "cpu" and backend_of(plain) == "plain"


@pytest.mark.parametrize("share_prompt,recompute_mlp", [(True, True), (False, True), (True, False)])
def test_fused_model_equals_plain_logprobs_entropy_loss_and_grads(make_tiny_model, share_prompt, recompute_mlp):
    plain, fused, _ = _pair(make_tiny_model, recompute_mlp=recompute_mlp)
    batch, adv = _grouped_batch(G=3)
    ref_logp = batch_logprobs(plain, batch, temperature=0.7, micro_batch_size=4)
    torch.testing.assert_close(batch_logprobs(fused, batch, temperature=0.7, micro_batch_size=4), ref_logp)
    a = _loss_and_grads(plain, batch, adv, ref_logp, share_prompt=share_prompt)
    b = _loss_and_grads(fused, batch, adv, ref_logp, share_prompt=share_prompt)
    for x, y in zip(b[:3], a[:3]):  # log-probs, entropies, loss
        torch.testing.assert_close(x, y)
    assert a[3].keys() == b[3].keys() and len(a[3]) == len(list(plain.parameters()))
    for name in a[3]:
        torch.testing.assert_close(b[3][name], a[3][name], msg=name)


@pytest.mark.parametrize("tied,copied", [(False, False), (True, False), (False, True)])
def test_embedding_gradient_accumulates_dense_over_micro_batches(make_tiny_model, tied, copied):
    """The sparse embedding gradient ends up in a dense ``.grad`` (untied: the weight's hook; tied:
    added to the head's), equal to the plain model's after two accumulated backward passes, with
    and without prompt sharing (its prompt pass adds through a gradient alias); also in a deep
    copy of a fused model (tensor hooks are not copied)."""
    plain, fused, counts = _pair(make_tiny_model, tie_word_embeddings=tied)
    assert counts["embedding"] == 1
    if copied:
        completion_logprobs(fused, _grouped_batch(G=2)[0], temperature=1.0)  # the original gets its hook
        fused = copy.deepcopy(fused)
    batch, adv = _grouped_batch(G=2, seed=3)
    ref_logp = torch.zeros(batch.completion_ids.shape)
    grads = {}
    for name, model in (("plain", plain), ("fused", fused)):
        model.zero_grad(set_to_none=True)
        for share in (True, False):
            logp, _ = completion_logprobs(model, batch, temperature=1.0, share_prompt=share)
            loss, _ = algo.policy_loss(
                logp,
                logp.detach(),
                adv,
                batch.completion_mask,
                algo.LossConfig(beta=0.04),
                ref_logp=ref_logp,
                num_sequences=len(batch),
                num_tokens=int(batch.completion_mask.sum()),
            )
            loss.backward()
        grads[name] = model.model.embed_tokens.weight.grad
    assert grads["fused"].layout == torch.strided
    torch.testing.assert_close(grads["fused"], grads["plain"])


def test_installing_plain_restores_the_stock_model(make_tiny_model):
    plain, fused, _ = _pair(make_tiny_model, recompute_mlp=False)
    batch, _ = _grouped_batch(G=2)
    completion_logprobs(fused, batch, temperature=1.0)  # a forward with gradient adds the densify hook
    assert fused.model.embed_tokens.weight._post_accumulate_grad_hooks
    assert install_backend(fused, "plain", announce=False) == "backend plain: model.backend=plain"
    assert backend_of(fused) == "plain"
    assert fused_head(fused) is None and fused.config._attn_implementation == "sdpa"
    assert not any(k in vars(m) for m in fused.modules() for k in ("forward", "_grpokit_recompute_mlp"))
    assert not fused.model.embed_tokens.weight._post_accumulate_grad_hooks


def test_fused_model_with_tied_embeddings_and_checkpointing(make_tiny_model):
    """The head weight is the embedding: both gradient paths add into one tensor; checkpointed
    layers recompute the fused ops."""
    from grpokit.models.logprobs import enable_gradient_checkpointing

    plain, fused, _ = _pair(make_tiny_model, tie_word_embeddings=True)
    assert fused.lm_head.weight is fused.model.embed_tokens.weight
    enable_gradient_checkpointing(fused)
    batch, adv = _grouped_batch(G=2, seed=1)
    ref_logp = torch.zeros(batch.completion_ids.shape)
    a = _loss_and_grads(plain, batch, adv, ref_logp)
    b = _loss_and_grads(fused, batch, adv, ref_logp)
    torch.testing.assert_close(b[2], a[2])
    for name in a[3]:
        torch.testing.assert_close(b[3][name], a[3][name], msg=name)


def test_fused_model_keeps_fewer_bytes_for_backward(make_tiny_model):
    plain, fused, _ = _pair(make_tiny_model, vocab_size=512, intermediate_size=128)
    batch, _ = _grouped_batch(G=4, T=24, seed=2)

    def saved(model):
        return saved_bytes(lambda: completion_logprobs(model, batch, temperature=1.0), *model.parameters())

    assert saved(fused) < 0.6 * saved(plain)
    # recompute_mlp=False: + gate(x) and up(x), two float32 (positions, 128) tensors per layer;
    # positions: 2 prompts × 8 shared prefix tokens + 8 rows × 24 (exact: saved_bytes keeps every
    # storage it counted, so no address is reused and counted once for two tensors)
    keep = copy.deepcopy(plain)
    _cpu(keep, recompute_mlp=False)
    extra = saved(keep) - saved(fused)
    assert extra == (2 * 8 + 8 * 24) * 2 * 128 * 4 * plain.config.num_hidden_layers
    assert saved(keep) < 0.75 * saved(plain)


def test_generation_is_unchanged(make_tiny_model, smollm2_tokenizer, smollm2_prompts):
    """Without gradient the replaced forwards run the original code: same sampled tokens."""
    from grpokit.rollout import SamplingParams, generate_rollouts

    plain, fused, _ = _pair(make_tiny_model, vocab_size=49152, pad_token_id=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    run = lambda m: generate_rollouts(
        m,
        smollm2_tokenizer,
        smollm2_prompts,
        3,
        params,  # noqa: E731
        eos_token_ids=[2, 0],
        seed=3,
    )
    assert torch.equal(run(fused).completion_ids, run(plain).completion_ids)


def test_a_module_whose_formula_differs_is_left_alone(make_tiny_model):
    """The one-off check before replacing: a norm class of a listed name computing something else
    (here Gemma's ``(1 + w)`` gain) keeps its own forward."""
    from transformers.models.llama import modeling_llama

    class LlamaRMSNorm(modeling_llama.LlamaRMSNorm):  # same name, other formula
        def forward(self, hidden_states):
            return super().forward(hidden_states) * 2.0

    model = make_tiny_model(**GQA)
    model.model.norm = LlamaRMSNorm(model.config.hidden_size)
    counts = apply_fused_ops(model)
    assert counts["rms_norm"] == 2 * model.config.num_hidden_layers  # the final norm was not switched
    assert "forward" not in vars(model.model.norm)


def test_other_architectures_are_left_as_they_are():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32)).eval()
    counts = apply_fused_ops(model)
    assert counts["rms_norm"] == counts["mlp"] == counts["head"] == counts["embedding"] == 0
    assert fused_head(model) is None


@pytest.mark.parametrize("q_len, grad", [(1, False), (5, True)])
def test_attention_function_equals_sdpa_with_repeated_heads(q_len, grad):
    """grpokit_sdpa_attention (one-token decoding path and the grouped-heads SDPA path) against
    SDPA on explicitly repeated KV heads, with a padding mask; float32."""
    import torch.nn.functional as F

    from grpokit.backends.cpu.attention import grpokit_sdpa_attention

    gen = torch.Generator().manual_seed(0)
    b, h, h_kv, k, d = 3, 6, 2, 9, 8
    q = torch.randn(b, h, q_len, d, generator=gen)
    key, value = torch.randn(b, h_kv, k, d, generator=gen), torch.randn(b, h_kv, k, d, generator=gen)
    mask = torch.ones(b, 1, q_len, k, dtype=torch.bool).tril(k - q_len)
    mask[1, ..., :4] = False  # left padding of row 1
    module = torch.nn.Module()
    module.num_key_value_groups = h // h_kv
    want = F.scaled_dot_product_attention(
        q, key.repeat_interleave(3, 1), value.repeat_interleave(3, 1), attn_mask=mask, scale=0.3
    ).transpose(1, 2)
    with torch.set_grad_enabled(grad):
        got, _ = grpokit_sdpa_attention(module, q, key, value, mask, scaling=0.3)
        additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        got_additive, _ = grpokit_sdpa_attention(module, q, key, value, additive, scaling=0.3)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_additive, want)


class _LoraLinear(torch.nn.Module):
    """A LoRA wrapper as peft builds one: ``base_layer`` plus ``lora_A``/``lora_B``, and a ``weight``
    property that reads the base layer's (so code that reads ``.weight`` sees no adapter)."""

    def __init__(self, base: torch.nn.Linear, rank: int = 2):
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = torch.nn.Linear(rank, base.out_features, bias=False)
        torch.nn.init.normal_(self.lora_B.weight, std=0.5, generator=torch.Generator().manual_seed(4))

    @property
    def weight(self):
        return self.base_layer.weight

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x))


def test_a_lora_wrapper_added_after_install_is_not_skipped(make_tiny_model):
    """peft wraps projections after the backend was installed: the fused MLP sees at call time that
    ``gate_proj`` is no longer a plain Linear and runs the module's own forward (it used to read
    ``gate_proj.weight``, the base weight, and drop the adapter silently)."""
    plain, fused, counts = _pair(make_tiny_model)
    assert counts["mlp"] == plain.config.num_hidden_layers
    for model in (plain, fused):
        mlp = model.model.layers[0].mlp
        mlp.gate_proj = _LoraLinear(mlp.gate_proj)
        torch.nn.init.normal_(mlp.gate_proj.lora_A.weight, std=0.5, generator=torch.Generator().manual_seed(5))
    batch, adv = _grouped_batch(G=3)
    ref_logp = torch.zeros(batch.completion_ids.shape)
    a = _loss_and_grads(plain, batch, adv, ref_logp)
    b = _loss_and_grads(fused, batch, adv, ref_logp)
    for x, y in zip(b[:3], a[:3]):
        torch.testing.assert_close(x, y)
    assert "model.layers.0.mlp.gate_proj.lora_A.weight" in b[3]
    for name in a[3]:
        torch.testing.assert_close(b[3][name], a[3][name], msg=name)


def test_modules_are_chosen_by_structure_not_by_class_name(make_tiny_model):
    """A norm of another class (``torch.nn.RMSNorm``, a renamed subclass) is switched; an MLP whose
    projection is a Linear subclass, or whose activation is not SiLU, is not."""
    from transformers.models.llama import modeling_llama

    class MyNorm(modeling_llama.LlamaRMSNorm):  # same formula, a name no list knows
        pass

    class MyLinear(torch.nn.Linear):
        pass

    plain = make_tiny_model(**GQA)
    h, layers = plain.config.hidden_size, plain.config.num_hidden_layers
    norm = torch.nn.RMSNorm(h, eps=plain.config.rms_norm_eps)
    norm.weight.data.copy_(torch.rand(h, generator=torch.Generator().manual_seed(2)) + 0.5)
    plain.model.norm = norm
    renamed = MyNorm(h, eps=plain.config.rms_norm_eps)
    renamed.weight.data.copy_(plain.model.layers[0].input_layernorm.weight)
    plain.model.layers[0].input_layernorm = renamed
    mlp0, mlp1 = plain.model.layers[0].mlp, plain.model.layers[1].mlp
    sub = MyLinear(mlp0.up_proj.in_features, mlp0.up_proj.out_features, bias=False)
    sub.weight.data.copy_(mlp0.up_proj.weight)
    mlp0.up_proj = sub
    mlp1.act_fn = torch.nn.GELU()
    fused = copy.deepcopy(plain)
    counts = _cpu(fused)
    assert counts["rms_norm"] == 2 * layers + 1 and counts["mlp"] == 0
    assert "forward" in vars(fused.model.norm) and "forward" in vars(fused.model.layers[0].input_layernorm)
    batch, adv = _grouped_batch(G=2)
    ref_logp = torch.zeros(batch.completion_ids.shape)
    a, b = _loss_and_grads(plain, batch, adv, ref_logp), _loss_and_grads(fused, batch, adv, ref_logp)
    torch.testing.assert_close(b[2], a[2])
    for name in a[3]:
        torch.testing.assert_close(b[3][name], a[3][name], msg=name)
