"""Loading a pair through its engine: one entry for the CLI, the sweep and the pytest plugin."""

from __future__ import annotations

import pytest

from harness import engines, models
from harness.errors import HarnessError
from harness.pytest_plugin import PairCache
from harness.setup import GenerationSettings


def test_an_unknown_engine_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "load_pair", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(HarnessError, match="transformers, onnxruntime-genai"):
        engines.load("tiny-llama", engine="vllm")
    with pytest.raises(HarnessError, match="choose one of"):
        engines.check_settings("vllm", GenerationSettings())


@pytest.mark.parametrize("setting", engines.NOT_FOR_GENAI)
def test_the_engine_refuses_settings_of_transformers_loop(setting: str) -> None:
    value = 64 if setting == "draft_vocab" else "fp32"
    with pytest.raises(HarnessError, match=f"--{setting} applies to --engine transformers"):
        engines.load("tiny-qwen2", engine=engines.GENAI, **{setting: value})


def test_two_spellings_of_one_configuration_share_one_load() -> None:
    cache = PairCache(None)
    registered = cache.get("tiny-llama")
    assert cache.get("tiny-llama", target_precision="fp32", draft_kernels="stock") is registered
    assert cache.get("tiny-llama", with_draft=False) is not registered
    assert cache.get("tiny-llama", with_draft=False).draft is None
