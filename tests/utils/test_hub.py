"""Names that reach the hub (grpokit.utils.hub): a path-shaped typo is refused at once, and an
unreachable hub fails in seconds with one line, for models, tokenizers, configs and reward models."""

from __future__ import annotations

import time

import huggingface_hub.constants as hub_constants
import pytest

from grpokit.models import loading
from grpokit.rewards.rm import load_reward_model
from grpokit.utils import hub


@pytest.fixture
def no_hub(monkeypatch):
    """Online mode with an endpoint that refuses connections (port 9 on loopback)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")
    probe = hub.hub_probe
    probe.cache_clear()
    yield
    probe.cache_clear()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("runs/nope", True),
        ("./model", True),
        ("../x/y", True),
        ("/abs/model", True),
        ("~/model", True),
        (".hidden", True),
        ("a/b/c", True),
        ("folder/", True),
        ("w.safetensors", True),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", False),
        ("gpt2", False),
    ],
)
def test_path_shapes(name, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.looks_like_local_path(name) is expected


def test_first_part_that_exists_makes_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not hub.looks_like_local_path("mymodels/typo")
    (tmp_path / "mymodels").mkdir()
    assert hub.looks_like_local_path("mymodels/typo")


def test_a_path_typo_is_refused_without_asking_the_hub(tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)

    def asked() -> None:
        raise AssertionError("the hub was asked about a path")

    monkeypatch.setattr(hub, "hub_probe", asked)
    for load in (loading.load_model, loading.load_tokenizer, loading.model_max_positions):
        with pytest.raises(FileNotFoundError, match=r"'runs/nope': no such local file or folder"):
            load("runs/nope")
    with pytest.raises(ValueError, match=r"reward model 'rm:runs/nope': no such local folder"):
        load_reward_model("rm:runs/nope")


def test_unreachable_hub_fails_in_seconds_with_one_line(no_hub):
    t0 = time.perf_counter()
    for load, what in (
        (loading.load_tokenizer, "tokenizer"),
        (loading.load_model, "model"),
        (loading.model_max_positions, "config"),
    ):
        with pytest.raises(ConnectionError) as info:
            load("some-org/not-cached")
        text = str(info.value)
        assert "\n" not in text
        assert text.startswith(f"cannot load {what} 'some-org/not-cached': it is not a local path")
        assert "http://127.0.0.1:9" in text and "HF_HUB_OFFLINE=1" in text
    with pytest.raises(ConnectionError, match=r"cannot load reward model 'org/rm'"):
        load_reward_model("rm:org/rm")
    assert time.perf_counter() - t0 < 10  # today: five back-off retries per file, about a minute


def test_cached_name_reads_the_cache_only_when_the_hub_is_unreachable(no_hub, tmp_path, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    assert hub.hub_probe() is not None  # the refused endpoint
    with pytest.raises(ConnectionError):
        hub.hub_access("model", "org/cached")
    (tmp_path / "models--org--cached" / "snapshots" / "abc123").mkdir(parents=True)
    assert hub.hub_access("model", "org/cached") is True
    assert hub.from_pretrained_options("model", "org/cached") == {"local_files_only": True}


def test_offline_or_reachable_hub_changes_nothing(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "hub_probe", lambda: "never asked offline")
    assert hub.hub_access("model", "org/x") is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_probe", lambda: None)
    assert hub.hub_access("model", "org/x") is False


def test_an_hf_dataset_fails_in_seconds_and_a_cached_one_reads_the_cache(no_hub, tmp_path, monkeypatch):
    """``hf:<name>`` with the hub unreachable: one line within seconds (today: 35 s of retries);
    prepared in datasets' cache: load_dataset runs offline (datasets' own flag set for the call)."""
    pytest.importorskip("datasets")
    import datasets

    from grpokit.data import load_rows
    from grpokit.data.files import read_hf_dataset

    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"^cannot load dataset 'some-org/not-cached': it is not a local path"):
        load_rows("hf:some-org/not-cached", "train", limit=2)
    assert time.perf_counter() - t0 < 10
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    (tmp_path / "org___cached" / "default").mkdir(parents=True)
    seen = {}

    def fake_load(name, split, **kw):
        seen.update(name=name, split=split, offline=datasets.config.HF_HUB_OFFLINE)
        return [{"question": "q", "answer": "a"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as imported online
    assert read_hf_dataset("org/cached", "train", 1, {}) == [{"question": "q", "answer": "a"}]
    assert seen == {"name": "org/cached", "split": "train[:1]", "offline": True}
    assert datasets.config.HF_HUB_OFFLINE is False  # only for that call
