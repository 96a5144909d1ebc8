"""Shared pytest fixtures: the real SmolLM2 tokenizer and tiny random Llama models.

Fixtures (all CPU, float32, deterministic):

``smollm2_tokenizer`` (session)
    The real SmolLM2-135M-Instruct tokenizer from ``grpokit.models.loading.load_tokenizer("smollm2-135m-instruct")``:
    left padding, ``<|im_start|>`` = 1 (bos), ``<|im_end|>`` = 2 (eos and pad), ``<|endoftext|>`` = 0,
    ChatML chat template, vocab 49152. The first use in a fresh cache builds the model folder from the
    packaged GGUF (~15-20 s, once); later sessions load it in ~0.1 s. Treat it as read-only.

``smollm2_prompts`` (session)
    Two chat-templated prompt strings of different token lengths (``add_generation_prompt=True``).

``smollm2_eos_ids`` (session)
    ``[2, 0]``: the EOS ids of the packaged model (``<|im_end|>``, ``<|endoftext|>``).

``make_tiny_model`` (factory)
    ``make_tiny_model(vocab_size=49152, seed=0, **config_overrides) -> LlamaForCausalLM``: a fresh
    random Llama (hidden 32, 2 layers, 2 heads, intermediate 64, untied embeddings
    so greedy decoding does not just echo the last prompt token), built under
    ``torch.manual_seed(seed)`` (the global RNG is left untouched), in eval mode. Special ids match
    SmolLM2 (bos 1, eos 2, pad 2; ``generation_config.eos_token_id == [2, 0]``) unless overridden.
    Same arguments -> identical weights.

``tiny_model``
    ``make_tiny_model()``: a fresh SmolLM2-vocab (49152) tiny model per test; pair it with
    ``smollm2_tokenizer``. Its logits are near-uniform, so sampled EOS is rare: to get EOS in a
    test, pass extra ids in ``eos_token_ids`` or pick an EOS from a greedy run.

``tiny_model_v64``
    ``make_tiny_model(vocab_size=64, pad_token_id=0)``: no tokenizer needed, for pure-tensor tests
    (bos 1, eos 2, pad 0).

Threads: the test session runs torch on one CPU thread (``GRPOKIT_TEST_THREADS`` overrides). Tiny
models gain nothing from intra-op threads, and on a shared machine spinning OpenMP threads made
the rollout tests ~4x slower (22 s vs 5.6 s measured).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import pytest
import torch

from support import tiers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GRPOKIT_FAKE_REWARDS_DIR", tempfile.mkdtemp(prefix="grpokit-fake-rewards-"))
torch.set_num_threads(int(os.environ.get("GRPOKIT_TEST_THREADS", "1")))
os.environ.setdefault("GRPOKIT_THREADS", "off")  # runs keep that count, whatever else the machine runs

_CLOCK: tiers.TierClock | None = None

# -- tiers (tests/support/tiers.py): markers, limits, the workers' order, the time per tier ---------


def pytest_configure(config):
    for line in tiers.MARKERS:
        config.addinivalue_line("markers", line)
    config.addinivalue_line("markers", f"curves: {CURVES_MARKER}")


def pytest_sessionstart(session):
    global _CLOCK
    _CLOCK = tiers.TierClock()  # its wall time counts from here, as pytest's own summary


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook reads the xdist_group marks into the node ids
def pytest_collection_modifyitems(config, items):
    tiers.order_and_group(items, group=config.pluginmanager.hasplugin("xdist"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    tiers.check_limit(item, outcome.get_result())


def pytest_runtest_logreport(report):
    if _CLOCK is not None:
        _CLOCK.add(report)


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller prints
        return
    terminalreporter.write_sep("-", "time per tier (tests/support/tiers.py)")
    workers = getattr(config.option, "numprocesses", None) or 1
    for line in _CLOCK.lines(workers) if _CLOCK is not None else ():  # wall: since pytest_sessionstart
        terminalreporter.write_line(line)


CURVES_MARKER = (
    "its runs draw curves.png at the end of training; the other tests' runs skip matplotlib "
    "(0.4 s a run, on every tiny run of the suite)"
)


@pytest.fixture(autouse=True)
def _curves_only_where_read(request, monkeypatch):
    """The training loop's ``plot_curves`` is a no-op (it returns False: "not drawn", as without
    matplotlib) unless the test is marked ``curves``; the tests of the drawing itself call
    :func:`grpokit.metrics.curves.plot_curves` directly and are not affected."""
    if request.node.get_closest_marker("curves") is None:
        monkeypatch.setattr("grpokit.trainer.loop.plot_curves", lambda *args, **kwargs: False)


SMOLLM2_VOCAB = 49152
SMOLLM2_BOS, SMOLLM2_EOS, SMOLLM2_PAD, SMOLLM2_ENDOFTEXT = 1, 2, 2, 0


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from grpokit.models.loading import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_prompts(smollm2_tokenizer) -> list[str]:
    chats = [
        [{"role": "user", "content": "What is 2 + 3?"}],
        [
            {"role": "system", "content": "Answer with one number."},
            {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. Total?"},
        ],
    ]
    return [smollm2_tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]


@pytest.fixture(scope="session")
def smollm2_eos_ids() -> list[int]:
    return [SMOLLM2_EOS, SMOLLM2_ENDOFTEXT]


def _make_tiny_model(vocab_size: int = SMOLLM2_VOCAB, seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=SMOLLM2_BOS,
        eos_token_id=SMOLLM2_EOS,
        pad_token_id=SMOLLM2_PAD,
    )
    kwargs.update(overrides)
    config = LlamaConfig(**kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    eos = [config.eos_token_id] + ([SMOLLM2_ENDOFTEXT] if vocab_size == SMOLLM2_VOCAB else [])
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()


@pytest.fixture
def no_model_load(monkeypatch):
    """``grpokit.models.loading.load_model`` fails the test if called (a check that must come before any
    model loads)."""
    import grpokit.models.loading

    calls = []
    monkeypatch.setattr(
        grpokit.models.loading, "load_model", lambda *a, **k: calls.append(a) or pytest.fail("load_model was called")
    )
    yield calls
    assert not calls


@pytest.fixture
def make_tiny_model() -> Callable[..., torch.nn.Module]:
    return _make_tiny_model


@pytest.fixture
def tiny_model():
    return _make_tiny_model()


@pytest.fixture
def tiny_model_v64():
    return _make_tiny_model(vocab_size=64, pad_token_id=0)


# -- trainer fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    """A folder holding a tiny random SmolLM2-vocab Llama (``_make_tiny_model()``, safetensors,
    ``generation_config.eos_token_id == [2, 0]``) and the real SmolLM2 tokenizer: what recipes in
    trainer tests point ``model.name_or_path`` at. Session-scoped; treat it as read-only."""
    path = tmp_path_factory.mktemp("tiny_llama")
    _make_tiny_model().save_pretrained(path, safe_serialization=True)
    smollm2_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def rank_forker():
    """Ranks of ``python -m grpokit`` forked from one warm process per test worker
    (:mod:`support.ranks`): a 2-rank launch without torchrun's launcher and imports."""
    from support.helpers import subprocess_env
    from support.ranks import RankForker

    forker = RankForker(subprocess_env())
    yield forker
    forker.close()
