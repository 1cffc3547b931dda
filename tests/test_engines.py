"""Loading a pair through its engine: one entry for the CLI, the sweep and the pytest plugin."""

from __future__ import annotations

import dataclasses

import pytest

from harness import cli
from harness.base.errors import HarnessError
from harness.decoding import engines
from harness.pairs import models
from harness.settings import setup
from harness.suite import PairCache


def test_an_unknown_engine_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "load_pair", lambda *a, **k: pytest.fail("loaded"))
    spec = models.get_pair("tiny-llama")
    run = setup.resolve(spec)
    with pytest.raises(HarnessError, match="transformers, onnxruntime-genai"):
        engines.load(spec, dataclasses.replace(run, target=dataclasses.replace(run.target, engine="vllm")))
    with pytest.raises(HarnessError, match="choose one of"):
        engines.check(spec, dataclasses.replace(run, target=dataclasses.replace(run.target, engine="vllm")))


def test_every_registered_engine_is_a_class_of_that_name_and_offered() -> None:
    for name in engines.REGISTRY:
        assert engines.engine_class(name).name == name
    assert set(cli.build_parser().parse_args(["--engine", name]).engine for name in engines.REGISTRY) == set(
        engines.REGISTRY
    )


@pytest.mark.parametrize("setting", ["draft_precision", "draft_vocab", "draft_kernels", "target_kernels"])
def test_the_engine_refuses_settings_of_transformers_loop(setting: str) -> None:
    value = 64 if setting == "draft_vocab" else "fp32"
    spec = models.get_pair("tiny-qwen2")
    with pytest.raises(HarnessError, match=f"--{setting} applies to --engine transformers"):
        setup.resolve(spec, target_backend="onnxruntime", engine=engines.GENAI, **{setting: value})


def test_a_run_of_one_pair_does_not_load_another() -> None:
    run = setup.resolve(models.get_pair("tiny-llama"))
    with pytest.raises(HarnessError, match="cannot load pair tiny-qwen2"):
        engines.load("tiny-qwen2", run)


def test_two_spellings_of_one_configuration_share_one_load() -> None:
    cache = PairCache(None)
    registered = cache.get("tiny-llama")
    assert cache.get("tiny-llama", target_precision="fp32", draft_kernels="stock") is registered
    assert cache.get("tiny-llama", with_draft=False) is not registered
    assert cache.get("tiny-llama", with_draft=False).draft is None
