"""A stand-in for the few vLLM calls grpokit's vllm engines make (``tests/`` is on the path):
:class:`FakeLLM` samples with a torch copy of the model holding only the weights pushed to it;
:func:`install_fake_vllm` puts it in ``sys.modules`` as ``vllm``."""

from __future__ import annotations

import sys
import types

import torch


class InprocClient:  # the name the engine checks: vLLM runs in this process
    pass


class FakeLLM:
    """The vLLM calls the engine makes. Samples with its own copy of the model, which holds only the
    weights pushed through ``collective_rpc("reload_weights")`` (random until the first push, as with
    ``load_format="dummy"``): one token per step, Gumbel-max with a generator seeded by the request's
    seed, stopping after a stop token id."""

    built: list[FakeLLM] = []

    def __init__(self, folder, **kw):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.kw, self.pushes, self.resets = kw, 0, 0
        self.requests: list[tuple[list[int], object]] = []  # (prompt ids, sampling params) of each request
        self.net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).eval()
        self.llm_engine = types.SimpleNamespace(engine_core=InprocClient())
        FakeLLM.built.append(self)

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"]
        self.net.load_state_dict(dict(kwargs["weights_iterator"]))  # a copy: later writes do not reach it
        self.pushes += 1

    def reset_prefix_cache(self):
        assert not getattr(self, "asleep", False), "the prefix cache reset while asleep"
        self.resets += 1
        return True

    def sleep(self, level):
        assert level == 1 and not getattr(self, "asleep", False)
        self.asleep, self.sleeps = True, getattr(self, "sleeps", 0) + 1

    def wake_up(self):
        assert self.asleep
        self.asleep = False

    @torch.no_grad()
    def generate(self, inputs, params, use_tqdm=True):
        assert not getattr(self, "asleep", False), "generate while asleep"
        outs = []
        for prompt, sp in zip(inputs, params):
            self.requests.append((list(prompt["prompt_token_ids"]), sp))
            ids, gen, lps = list(prompt["prompt_token_ids"]), torch.Generator().manual_seed(sp.seed), []
            for _ in range(sp.max_tokens):
                logits = self.net(torch.tensor([ids])).logits[0, -1].double()
                if sp.temperature == 0:
                    t = int(logits.argmax())
                else:
                    logp = (logits / sp.temperature).log_softmax(-1)
                    gumbel = -torch.empty_like(logp).exponential_(generator=gen).log()
                    t = int((logp + gumbel).argmax())
                    lps.append({t: types.SimpleNamespace(logprob=float(logp[t]))})
                ids.append(t)
                if t in sp.stop_token_ids:
                    break
            n = len(ids) - len(prompt["prompt_token_ids"])
            outs.append(
                types.SimpleNamespace(
                    outputs=[
                        types.SimpleNamespace(token_ids=ids[-n:], logprobs=lps if sp.logprobs is not None else None)
                    ]
                )
            )
        return outs


def install_fake_vllm(monkeypatch) -> list[FakeLLM]:
    """``vllm`` = a module with :class:`FakeLLM` (for this test); returns the list of the LLMs it builds."""
    mod = types.ModuleType("vllm")
    mod.LLM = FakeLLM
    mod.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    mod.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    FakeLLM.built = []
    return FakeLLM.built
