"""Device names are validated before any weights load, with errors that say what to do."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from harness.base import devices as devices_module
from harness.base.devices import available_devices, check_device, place
from harness.base.errors import HarnessError, UnsupportedError
from harness.settings.precision import apply_precision

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cpu_is_always_available():
    assert check_device("cpu") == torch.device("cpu")
    assert check_device(" CPU ") == torch.device("cpu")
    assert available_devices()[0] == "cpu"


def test_available_devices_all_pass_check_device():
    for name in available_devices():
        assert check_device(name).type == name.split(":")[0]


@needs_no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_says_why(name):
    with pytest.raises(UnsupportedError) as info:
        check_device(name)
    message = str(info.value)
    assert name in message and "cpu" in message
    if torch.version.cuda is None:
        assert "CPU-only build" in message and "no CUDA" in message
    assert not any(d.startswith("cuda") for d in available_devices())


@needs_cuda
def test_cuda_index_out_of_range_is_refused():
    count = torch.cuda.device_count()
    assert check_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(UnsupportedError, match=f"has {count} CUDA device"):
        check_device(f"cuda:{count}")


@pytest.mark.parametrize("name", ["npu", "npu:0"])
def test_npu_is_a_clear_extension_point(name):
    with pytest.raises(UnsupportedError, match="no NPU backend is available on this machine") as info:
        check_device(name)
    assert "would need" in str(info.value)


@pytest.mark.parametrize("name", ["tpu", "gpu", "cuda:x", ""])
def test_unknown_device_lists_the_accepted_forms(name):
    with pytest.raises(HarnessError, match="Unknown device") as info:
        check_device(name)
    assert "'cpu'" in str(info.value) and "cuda:N" in str(info.value)


def test_place_moves_to_cpu_and_returns_model():
    model = nn.Linear(4, 2)
    assert place(model, "cpu") is model
    assert model.weight.device.type == "cpu"


@needs_no_cuda
def test_place_checks_the_device_before_moving():
    model = nn.Linear(4, 2)
    with pytest.raises(UnsupportedError, match="not available"):
        place(model, "cuda")
    assert model.weight.device.type == "cpu"


@needs_cuda
def test_place_refuses_cpu_only_quantized_layers_on_cuda():
    model = apply_precision(nn.Sequential(nn.Linear(64, 32)), "w8abf16")
    with pytest.raises(UnsupportedError, match="CPU-only quantized"):
        place(model, "cuda")


@pytest.mark.parametrize(
    ("precision", "cpu_only"), [("fp32", 0), ("bf16", 0), ("w8af32", 2), ("w4abf16", 2), ("w8abf16", 2)]
)
def test_cpu_only_layers_are_detected_for_every_quantized_precision(precision, cpu_only):
    # What `place` refuses to move off the CPU; checked directly because this machine has no GPU.
    from harness.base.devices import _cpu_only_modules

    model = apply_precision(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)), precision)
    assert len(_cpu_only_modules(model)) == cpu_only


@needs_cuda
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_a_cuda_target_verifies_a_cpu_drafts_tokens_exactly(name):
    """The seeds' split, the target on the accelerator and the draft on the CPU, with CUDA as the
    accelerator: greedy assisted output is the target's own, token for token, or leaves it only at
    a near tie of the target's logits; and the draft's tokens were really verified there."""
    from helpers import load_pair

    from harness.experiments import equivalence
    from harness.settings.setup import GenerationSettings
    from harness.weights import tiny

    pair = load_pair(
        name, target_device="cuda", draft_device="cpu", target_precision="fp32", draft_precision="fp32",
        target_kernels="stock",
    )  # fmt: skip
    assert {p.device.type for p in pair.target.parameters()} == {"cuda"}
    assert {p.device.type for p in pair.draft.parameters()} == {"cpu"}
    settings = GenerationSettings(mode="assisted", max_new_tokens=32, ignore_eos=True, num_assistant_tokens=4)
    result = equivalence.check_case(pair, [tiny.BOS_ID, *range(40, 59)], settings)
    assert result.acceptable, result.explain()
    assert len(result.assisted.output_ids) == len(result.plain.output_ids) == 32
    assert result.assisted.drafted > 0 and result.assisted.accepted > 0


@needs_cuda
def test_a_cuda_target_keeps_min_new_tokens_with_a_cpu_draft():
    """transformers hands the target's minimum-length rule to the CPU draft's own generate: with its
    EOS ids left on the GPU the first draft step failed. The rule holds on both, and assisted output
    is still the target's own."""
    from helpers import load_pair

    from harness.experiments import equivalence
    from harness.settings.setup import GenerationSettings
    from harness.weights import tiny

    pair = load_pair("tiny-llama", target_device="cuda", draft_device="cpu", target_precision="fp32")
    settings = GenerationSettings(
        mode="assisted", max_new_tokens=12, min_new_tokens=12, num_assistant_tokens=3
    )
    result = equivalence.check_case(pair, [tiny.BOS_ID, 7, 9], settings)
    assert result.acceptable, result.explain()
    assert len(result.assisted.output_ids) == 12


def test_the_minimum_length_rule_masks_as_transformers_does():
    """The rule a pair split across devices runs is transformers' own: the same scores masked, on
    the CPU as on any device; on one device the config keeps its own rule."""
    from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

    from harness.decoding.generation import MinNewTokensOnEveryDevice, generation_config, split_min_new_tokens
    from harness.settings.setup import GenerationSettings

    scores = torch.randn(1, 50)
    for length in (4, 9):
        ids = torch.arange(length).reshape(1, -1)
        ours = MinNewTokensOnEveryDevice(3, 4, [2, 5])(ids, scores)
        stock = MinNewTokensLengthLogitsProcessor(3, 4, [2, 5])(ids, scores)
        assert torch.equal(ours, stock)
    assert torch.isinf(MinNewTokensOnEveryDevice(3, 4, [2, 5])(torch.arange(4).reshape(1, -1), scores)[0, 5])

    from helpers import load_pair

    pair = load_pair("tiny-llama")
    config = generation_config(GenerationSettings(mode="assisted", min_new_tokens=5), pair)
    kwargs: dict = {}
    split_min_new_tokens(config, kwargs, pair, 3)
    assert config.min_new_tokens == 5 and "logits_processor" not in kwargs


def test_a_case_the_device_cannot_run_is_skipped_saying_why(monkeypatch):
    """Under `--target-device cuda`, a case whose kernels are the CPU's, or whose target runs on its
    own runtime, is skipped with the reason; one the CPU refuses as well stays the test's failure.
    Nothing is loaded: each is decided before any weight is placed, as on a host with a GPU."""
    from harness.decoding import engines
    from harness.pairs import models
    from harness.suite import PairCache

    monkeypatch.setattr(devices_module, "check_device", lambda name: torch.device(name))
    cache = PairCache(None, ("cuda", "cpu"))
    spec = models.get_pair("tiny-opt")
    for precision, kernels, why in [
        ("q4k", "invariant", "kernels only for cpu"),
        ("fp32", "invariant", "CPU only"),
    ]:
        run = engines.resolve(spec, target_precision=precision, target_kernels=kernels)
        with pytest.raises(pytest.skip.Exception, match=why):
            cache.load(spec, run)
    run = engines.resolve(models.get_pair("tiny-llama"), target_backend="onnxruntime")
    with pytest.raises(pytest.skip.Exception, match="places its models itself"):
        cache.load(models.get_pair("tiny-llama"), run)
    base = engines.resolve(spec)
    ort_only = dataclasses.replace(base, target=dataclasses.replace(base.target, precision="int4"))
    with pytest.raises(UnsupportedError, match="ONNX Runtime target's"):
        cache.load(spec, ort_only)
