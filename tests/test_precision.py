"""Precisions: kernel packing, whole-model conversion on three HF families, errors, real weights."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, OPTConfig, Qwen2Config

from harness.base.errors import HarnessError, UnsupportedError
from harness.settings.precision import (
    DEFAULT_GROUP_SIZE,
    INT4_GROUP_SIZES,
    PRECISIONS,
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    apply_precision,
    check_precision,
    compare_logits,
    describe,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
)

VOCAB = 512
QUANTIZED = ("w8af32", "w4abf16", "w8abf16")
EXPECTED_LINEAR_FORMAT = {
    "fp32": "fp32",
    "bf16": "bf16",
    "w8af32": "int8-dynamic",
    "w4abf16": f"int4-g{DEFAULT_GROUP_SIZE}",
    "w8abf16": "int8",
}
EXPECTED_REST_DTYPE = {"fp32": "fp32", "bf16": "bf16", "w8af32": "fp32", "w4abf16": "bf16", "w8abf16": "bf16"}


def _config(family: str, *, tied: bool = False):
    common = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4)
    if family == "llama":
        return LlamaConfig(**common, intermediate_size=256, num_key_value_heads=2, tie_word_embeddings=tied)
    if family == "qwen2":
        return Qwen2Config(**common, intermediate_size=256, num_key_value_heads=2, tie_word_embeddings=tied)
    # Tying is explicit because OPT ties by default; word_embed_proj_dim == hidden keeps project_in/out out.
    return OPTConfig(
        **common, ffn_dim=256, word_embed_proj_dim=128, max_position_embeddings=256, tie_word_embeddings=tied
    )


def _model(family: str, *, tied: bool = False, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(_config(family, tied=tied)).eval()


@pytest.fixture(scope="module", params=["llama", "opt", "qwen2"])
def family_model(request):
    model = _model(request.param)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (4, 32))  # 128 positions: enough for a stable top-1 rate
    with torch.no_grad():
        reference = model(ids).logits
    return request.param, model, ids, reference


def _linear_count(model: nn.Module) -> int:
    return sum(1 for m in model.modules() if type(m) is nn.Linear)


# --- whole models --------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_precision_logits_close_to_fp32(family_model, precision):
    family, model, ids, reference = family_model
    converted = apply_precision(copy.deepcopy(model), precision)
    with torch.no_grad():
        logits = converted(ids).logits
    spec = PRECISIONS[precision]
    assert logits.dtype == spec.torch_dtype
    agreement = compare_logits(logits, reference)
    assert agreement.positions == ids.numel()
    assert spec.accepts(agreement), (family, precision, agreement, spec.logit_tolerance)
    if precision != "fp32":  # it really changed the arithmetic, so the tolerance is not vacuous
        assert agreement.max_abs_over_std > 0


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_describe_shows_every_linear_converted(family_model, precision):
    family, model, _, _ = family_model
    n_linear = _linear_count(model)
    assert describe(model)["linear"] == {"fp32": n_linear}
    converted = apply_precision(copy.deepcopy(model), precision)
    info = describe(converted)
    assert info["linear"] == {EXPECTED_LINEAR_FORMAT[precision]: n_linear}
    rest = EXPECTED_REST_DTYPE[precision]
    assert set(info["embedding"]) == {rest}
    assert set(info["other_params"]) == {rest}


@pytest.mark.parametrize("precision", QUANTIZED)
def test_quantized_model_generates_with_cache(precision):
    model = apply_precision(_model("llama"), precision)
    torch.manual_seed(2)
    ids = torch.randint(0, VOCAB, (1, 6))
    out = model.generate(
        ids,
        max_new_tokens=4,
        min_new_tokens=4,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (1, 10)
    with torch.no_grad():
        full = model(out.sequences[:, :-1]).logits[:, 5:]
    # The first token comes from the prompt forward itself: exactly the full forward's argmax.
    assert out.sequences[0, 6] == full[0, 0].argmax()
    # Later ones are cached one-token steps; batched and one-token arithmetic may differ slightly
    # (MODELS.md), so they must agree with one full forward within the precision's tolerance.
    steps = torch.stack(out.logits, dim=1)
    assert PRECISIONS[precision].accepts(compare_logits(steps, full))


def test_group_size_is_configurable_and_validated():
    model = apply_precision(_model("llama"), "w4abf16", group_size=128)
    assert describe(model)["linear"] == {"int4-g128": _linear_count(_model("llama"))}
    with pytest.raises(UnsupportedError, match="group size 48.*32, 64, 128, 256"):
        apply_precision(_model("llama"), "w4abf16", group_size=48)


@pytest.mark.parametrize("family", ["llama", "opt", "qwen2"])
@pytest.mark.parametrize("precision", QUANTIZED)
def test_tied_embedding_kept_when_lm_head_quantized(family, precision):
    model = _model(family, tied=True)
    embedding = model.get_input_embeddings()
    assert model.get_output_embeddings().weight is embedding.weight
    before = embedding.weight.detach().clone()
    apply_precision(model, precision)
    rest = PRECISIONS[precision].torch_dtype
    assert torch.equal(model.get_input_embeddings().weight, before.to(rest))
    assert not isinstance(model.get_output_embeddings(), nn.Linear)  # lm_head itself was quantized
    assert model.config.tie_word_embeddings is False
    # A later re-tie (transformers calls it on some paths) must neither fail nor undo the quantization.
    model.tie_weights()
    assert not isinstance(model.get_output_embeddings(), nn.Linear)
    assert torch.equal(model.get_input_embeddings().weight, before.to(rest))


def test_applying_twice_is_refused():
    model = apply_precision(_model("llama"), "w8abf16")
    with pytest.raises(UnsupportedError, match="already quantized"):
        apply_precision(model, "w4abf16")


def test_model_without_linear_layers_is_refused():
    with pytest.raises(UnsupportedError, match="has none"):
        apply_precision(nn.Sequential(nn.Embedding(8, 4)), "w4abf16")


# --- single layers: the kernels against explicit dequantized matmuls ------------------------------


def _linear(in_features: int, out_features: int, bias: bool, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias)


def _assert_matches_reference(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias) -> None:
    # Reference in fp32 from the same bf16 input; the kernel's only extra error is rounding its bf16
    # output (and the bias add in bf16): relative 2^-8 of the output magnitude.
    ref = x.to(torch.bfloat16).float() @ weight.t()
    if bias is not None:
        ref = ref + bias.to(torch.bfloat16).float()
    assert y.dtype == torch.bfloat16
    assert y.shape == ref.shape
    err = (y.float() - ref).abs().max()
    assert err <= 2**-7 * ref.abs().max(), float(err)


@pytest.mark.parametrize("group_size", INT4_GROUP_SIZES)
@pytest.mark.parametrize(("in_features", "out_features"), [(256, 64), (320, 48), (200, 40)])
def test_int4_linear_matches_dequantized_reference(group_size, in_features, out_features):
    linear = _linear(in_features, out_features, bias=True)
    layer = Int4WeightOnlyLinear.from_linear(linear, group_size)
    codes = quantize_int4_groupwise(linear.weight, group_size)
    weight = codes.dequantize(out_features, in_features)
    torch.manual_seed(1)
    x = torch.randn(2, 3, in_features)  # fp32 input with two leading dims
    y = layer(x)
    assert y.shape == (2, 3, out_features)
    _assert_matches_reference(y.reshape(-1, out_features), x.reshape(-1, in_features), weight, linear.bias)
    # And the dequantized weight is the original within half a quantization step per group.
    step = codes.scale.repeat_interleave(group_size, 1)[:out_features, :in_features]
    assert ((weight - linear.weight.detach()).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize(("in_features", "out_features"), [(256, 64), (100, 7), (33, 9)])
def test_int8_linear_matches_dequantized_reference(in_features, out_features):
    linear = _linear(in_features, out_features, bias=False)
    layer = Int8WeightOnlyLinear.from_linear(linear)
    q, scale = quantize_int8_per_channel(linear.weight)
    weight = (q.float() * scale[:, None])[:, :in_features]
    torch.manual_seed(1)
    x = torch.randn(5, in_features, dtype=torch.bfloat16)
    _assert_matches_reference(layer(x), x, weight, None)
    assert ((weight - linear.weight.detach()).abs() <= scale[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("cls", [Int4WeightOnlyLinear, Int8WeightOnlyLinear])
def test_quantized_linear_rejects_wrong_width_and_handles_empty_batch(cls):
    layer = cls.from_linear(_linear(128, 32, bias=False))
    with pytest.raises(ValueError, match="expects 128"):
        layer(torch.randn(2, 64))
    assert layer(torch.randn(0, 128)).shape == (0, 32)


def test_rows_do_not_depend_on_batch_size():
    # MODELS.md measured that these kernels compute a row the same whatever M; the harness's
    # exactness analysis relies on it, so a torch upgrade that breaks it should be noticed.
    torch.manual_seed(0)
    x = torch.randn(16, 256)
    for layer in (
        Int4WeightOnlyLinear.from_linear(_linear(256, 64, bias=False)),
        Int8WeightOnlyLinear.from_linear(_linear(256, 64, bias=False)),
    ):
        full = layer(x)
        for m in (1, 3, 8):
            assert torch.equal(layer(x[:m]), full[:m])


# --- compare_logits and errors --------------------------------------------------------------------


def test_compare_logits_metric():
    ref = torch.tensor([[0.0, 2.0, -2.0], [1.0, 0.0, -1.0]])
    test = ref.clone()
    test[1, 0] = -0.5  # changes row 1's argmax from 0 to 1
    agreement = compare_logits(test, ref)
    assert agreement.top1_agreement == 0.5
    assert agreement.max_abs_over_std == pytest.approx(1.5 / float(ref.std()))
    assert agreement.positions == 2


def test_unknown_precision_lists_valid_names():
    with pytest.raises(UnsupportedError) as info:
        check_precision("int3")
    assert isinstance(info.value, HarnessError)
    for name in PRECISIONS:
        assert name in str(info.value)


def test_check_precision_returns_spec_for_every_name():
    for name, spec in PRECISIONS.items():
        assert check_precision(name, "cpu") is spec
        assert spec.tolerance_reason and spec.description


def test_cpu_only_precision_refused_for_other_device():
    with pytest.raises(UnsupportedError, match="cpu"):
        check_precision("w4abf16", "npu")  # the device error, raised before weights would load


def test_apply_precision_rejects_unknown_name_before_touching_model():
    model = _model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UnsupportedError, match="Unknown precision"):
        apply_precision(model, "fp8")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# --- real weights ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_draft():
    packaged = pytest.importorskip("harness.weights.packaged")
    model = packaged.get_model("qwen2.5-coder-0.5b")
    if not packaged.is_converted(model):
        pytest.skip(
            "converted Qwen2.5-Coder-0.5B folder not ready (harness.weights.packaged.ensure_converted)"
        )
    folder = packaged.converted_dir(model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n',
        return_tensors="pt",
    ).input_ids
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = base(ids).logits
    return folder, ids, reference


@pytest.mark.real
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_real_draft_logits_close_to_fp32(real_draft, precision):
    folder, ids, reference = real_draft
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model = apply_precision(model, precision)
    assert set(describe(model)["linear"]) == {EXPECTED_LINEAR_FORMAT[precision]}
    with torch.no_grad():
        logits = model(ids).logits
    spec = PRECISIONS[precision]
    agreement = compare_logits(logits, reference)
    assert spec.accepts(agreement), (precision, agreement)
