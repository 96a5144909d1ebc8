"""grpokit.models.loading: alias resolution, the SmolLM2 cache build, tokenizer setup, EOS ids, errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpokit.models import loading as models

# ---------------------------------------------------------------- cache location and aliases


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRPOKIT_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "grpokit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "grpokit"
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "gk"))
    assert models.cache_dir() == tmp_path / "gk" / "grpokit"


def test_aliases_resolve_to_one_complete_cache_folder(smollm2_tokenizer):
    path = Path(models.resolve_model_path("smollm2-135m-instruct"))
    assert path == models.cache_dir() / "models" / "smollm2-135m-instruct"
    assert models.resolve_model_path("smollm2") == str(path)
    assert models.resolve_model_path("SmolLM2-135M-Instruct") == str(path)
    for name in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
        "grpokit_source.json",
    ]:
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config  # plain float weights, not a GGUF-quantized model
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0] and gen["pad_token_id"] == 2 and gen["bos_token_id"] == 1
    assert not any(k in gen for k in ["temperature", "top_p", "top_k", "max_length"])


def test_other_names_pass_through(tmp_path):
    assert models.resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == ("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert models.resolve_model_path("gpt2") == "gpt2"
    assert models.resolve_model_path(str(tmp_path)) == str(tmp_path.resolve())


@pytest.mark.parametrize("bad", ["./no/such/model", "/no/such/model", "a/b/c", "bad name!"])
def test_unknown_local_path_names_the_path(bad):
    with pytest.raises(FileNotFoundError, match="no such local file or folder") as e:
        models.load_model(bad)
    assert repr(bad) in str(e.value)


def test_unreachable_hub_id_offline_names_it(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE=1") as e:
        models.load_tokenizer("grpokit-test/definitely-not-cached")
    assert "'grpokit-test/definitely-not-cached'" in str(e.value)


# ---------------------------------------------------------------- the packaged model


def test_smollm2_tokenizer(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.padding_side == "left"
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert (tok.bos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("<|endoftext|>")) == (1, 2, 0)
    assert len(tok) == 49152
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    # The template carries the special tokens; the tokenizer adds none of its own.
    with_special = tok(text)["input_ids"]
    assert with_special == tok(text, add_special_tokens=False)["input_ids"]
    assert with_special[0] == 1 and with_special.count(1) == 3  # <|im_start|> x (system, user, assistant)


def test_load_smollm2_model():
    t0 = time.perf_counter()
    model = models.load_model("smollm2")
    load_s = time.perf_counter() - t0
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not model.training  # eval, as from_pretrained leaves it
    assert model.dtype == torch.float32 and model.config.vocab_size == 49152
    assert getattr(model, "hf_quantizer", None) is None
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    assert models.eos_token_ids(model, models.load_tokenizer("smollm2")) == [2, 0]
    assert load_s < 10  # cached: well under a second on an idle machine


# ---------------------------------------------------------------- eos_token_ids


@pytest.mark.parametrize(
    "gen_eos, tok_eos, expected",
    [
        (2, 2, [2]),
        ([2, 0], 2, [2, 0]),
        ([7, 2, 7], 5, [7, 2, 5]),
        (torch.tensor([3, 4]), None, [3, 4]),
        (None, 9, [9]),
    ],
)
def test_eos_token_ids(gen_eos, tok_eos, expected):
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=gen_eos))
    assert models.eos_token_ids(model, SimpleNamespace(eos_token_id=tok_eos)) == expected


def test_eos_token_ids_model_none_and_empty():
    assert models.eos_token_ids(None, SimpleNamespace(eos_token_id=4)) == [4]
    with pytest.raises(ValueError, match="no EOS"):
        models.eos_token_ids(None, SimpleNamespace(eos_token_id=None))


@pytest.mark.slow
def test_pad_token_chosen_when_missing(tmp_path, smollm2_tokenizer):
    tok_dir = tmp_path / "tok"
    smollm2_tokenizer.save_pretrained(tok_dir)
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    cfg.pop("pad_token", None)
    cfg["padding_side"] = "right"
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = models.load_tokenizer(str(tok_dir))
    assert tok.padding_side == "left"
    assert tok.pad_token == "<|endoftext|>"  # the unk token, an existing non-EOS token


# ---------------------------------------------------------------- atomic, concurrent first build


def _fake_builder(calls: list, delay: float = 0.2, fail: bool = False):
    def build(out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")
        time.sleep(delay)
        if fail:
            raise RuntimeError("boom")
        (out / models._MARKER).write_text("{}")

    return build


def test_concurrent_first_use_builds_once(monkeypatch, tmp_path):
    calls: list[Path] = []
    monkeypatch.setattr(models, "_build_smollm2", _fake_builder(calls))
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(models.resolve_model_path("smollm2"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    target = tmp_path / "grpokit" / "models" / "smollm2-135m-instruct"
    assert results == [str(target)] * 3
    assert len(calls) == 1 and calls[0].parent == target.parent  # temp dir is a sibling
    assert (target / models._MARKER).is_file()
    leftovers = [p.name for p in target.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == []


def test_failed_build_leaves_nothing_and_incomplete_folder_is_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    target = tmp_path / "grpokit" / "models" / "smollm2-135m-instruct"
    calls: list[Path] = []
    monkeypatch.setattr(models, "_build_smollm2", _fake_builder(calls, 0, fail=True))
    with pytest.raises(RuntimeError, match="boom"):
        models.resolve_model_path("smollm2")
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == [".smollm2-135m-instruct.lock"]

    target.mkdir()
    (target / "junk").write_text("half-written by an old version")  # no marker
    monkeypatch.setattr(models, "_build_smollm2", _fake_builder(calls, 0))
    assert models.resolve_model_path("smollm2") == str(target)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", models._MARKER]
    assert len(calls) == 2
