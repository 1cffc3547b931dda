"""Numeric precisions for target and draft models: names, checks, and in-place conversion.

Each precision is applied to one Hugging Face causal LM (OPT, Llama, Qwen2, ...) independently, so a
run can pair, say, a w4abf16 target with a w8af32 draft as the seeds did. Names are the seeds' own:
`w<weight bits>a<activation format>`.

The weight-only int4/int8 formats are hand-written thin wrappers around torch's own CPU kernels
(`aten._weight_int4pack_mm_for_cpu`, `aten._weight_int8pack_mm`) because the library that used to wrap
them (torchao) dropped its CPU int4 layout and its CPU int8 path was slower than fp32 on this class of
machine (docs/FINDINGS.md). The wrappers only quantize, pack and call the kernel.
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harness.base.errors import UnsupportedError

DEFAULT_GROUP_SIZE = 64
# The CPU int4 kernel accepts only these group sizes (it raises for others, checked in torch 2.13).
INT4_GROUP_SIZES = (32, 64, 128, 256)
# The CPU packer requires out_features divisible by 16; we pad rows up to it and slice the result.
_INT4_N_MULTIPLE = 16
# Argument of the packer; on CPU it does not change the layout's numerics, 2 is what torch's tests use.
_INT4_INNER_K_TILES = 2
# `_weight_int8pack_mm` reads past the end of a row unless in_features is a multiple of 8 on AVX2
# CPUs and of 16 on AVX-512 ones (it segfaults in torch 2.13: K=104 crashed on an AMD Zen 5), so
# we pad the input dimension with zeros to a multiple of 16.
_INT8_K_MULTIPLE = 16


@dataclass(frozen=True)
class PrecisionSpec:
    """One precision. Tolerances are against the same model in fp32 on the same input, measured by
    `compare_logits`: `logit_tolerance` bounds max |logits - fp32 logits| / std(fp32 logits), and
    `min_top1_agreement` bounds the fraction of positions whose argmax token matches fp32."""

    name: str
    description: str
    activation_dtype: str  # torch dtype name of activations between layers: "float32" or "bfloat16"
    weight_format: str  # format of nn.Linear weights after conversion (what `describe` reports)
    logit_tolerance: float
    min_top1_agreement: float
    tolerance_reason: str
    devices: tuple[str, ...]  # device types whose kernels this precision uses

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.activation_dtype)

    def accepts(self, agreement: LogitAgreement) -> bool:
        return (
            agreement.max_abs_over_std <= self.logit_tolerance
            and agreement.top1_agreement >= self.min_top1_agreement
        )


# Tolerances: about 1.5-2x the worst case measured (torch 2.13) on four short code/text prompts with the
# real Qwen2.5-Coder-0.5B and on random-init OPT/Llama/Qwen2 models (tests/test_precision.py checks
# both). Worst real cases, max|diff|/std and top-1: bf16 0.12 / 0.97, w8abf16 0.26 / 1.0,
# w4abf16 2.7 / 0.72, w8af32 4.6 / 0.76. Random-init models stay below these except w4abf16's top-1,
# 0.68 at worst: their nearly flat logits make the argmax fragile. These are regression guards, not
# accuracy claims: a broken int4 conversion (codes off by one level, or scales applied to the wrong
# groups) measured 11-26 std and 0% top-1 on the same prompts.
PRECISIONS: dict[str, PrecisionSpec] = {
    spec.name: spec
    for spec in (
        PrecisionSpec(
            name="fp32",
            description="float32 weights and activations (the reference)",
            activation_dtype="float32",
            weight_format="fp32",
            logit_tolerance=1e-4,
            min_top1_agreement=1.0,
            tolerance_reason="the reference itself: converting an fp32 model to fp32 changes nothing",
            devices=("cpu", "cuda"),
        ),
        PrecisionSpec(
            name="bf16",
            description="bfloat16 weights and activations",
            activation_dtype="bfloat16",
            weight_format="bf16",
            logit_tolerance=0.25,
            min_top1_agreement=0.9,
            tolerance_reason="bf16 keeps 8 mantissa bits: ~0.4% relative error per weight and per "
            "activation, accumulated over every layer",
            devices=("cpu", "cuda"),
        ),
        PrecisionSpec(
            name="w8af32",
            description="int8 dynamic quantization (torch.ao quantize_dynamic on every nn.Linear, "
            "per-tensor weight scale, activations quantized per call), float32 elsewhere",
            activation_dtype="float32",
            weight_format="int8-dynamic",
            logit_tolerance=7.0,
            min_top1_agreement=0.6,
            tolerance_reason="weights AND activations are rounded to 8 bits with ONE scale per "
            "tensor (lm_head included), so a few outlier channels coarsen every other value; the "
            "least accurate format on real Qwen2 weights",
            devices=("cpu",),
        ),
        PrecisionSpec(
            name="w4abf16",
            description="int4 weight-only, group-wise asymmetric scales (group size 64 by default), "
            "bfloat16 activations and bfloat16 everywhere else",
            activation_dtype="bfloat16",
            weight_format="int4",
            logit_tolerance=4.0,
            min_top1_agreement=0.6,
            tolerance_reason="16 levels per group of weights: ~5-10% relative weight error per layer, "
            "the coarsest format here",
            devices=("cpu",),
        ),
        PrecisionSpec(
            name="w8abf16",
            description="int8 weight-only, symmetric per-output-channel scales, bfloat16 activations "
            "and bfloat16 everywhere else",
            activation_dtype="bfloat16",
            weight_format="int8",
            logit_tolerance=0.5,
            min_top1_agreement=0.9,
            tolerance_reason="255 levels per output channel: weight error comparable to bf16 "
            "rounding, on top of bf16 activations",
            devices=("cpu",),
        ),
    )
}


# Precisions on k-quant blocks (harness.kernels.kquants), which run on the batch-invariant kernels only, so
# the float-model checks over PRECISIONS (stock kernels too) do not include them.
BLOCK_PRECISIONS: dict[str, PrecisionSpec] = {
    "gguf": PrecisionSpec(
        name="gguf",
        description="the GGUF file's own k-quant blocks (Q4_K/Q6_K) on batch-invariant kernels, "
        "activations quantized per row to int8 blocks of 256, float32 elsewhere",
        activation_dtype="float32",
        weight_format="gguf-kquant",
        logit_tolerance=7.0,
        min_top1_agreement=0.6,
        tolerance_reason="4-6 bit weights (the file's, as llama.cpp runs them) and 8-bit activations",
        devices=("cpu",),
    ),
    "q4k": PrecisionSpec(
        name="q4k",
        description="every linear layer quantized to Q4_K blocks (llama.cpp's 4-bit k-quant: 6-bit "
        "scales and mins per 32 weights) on the gguf precision's kernels, float32 elsewhere",
        activation_dtype="float32",
        weight_format="q4k",
        logit_tolerance=7.0,
        min_top1_agreement=0.6,
        tolerance_reason="16 levels per 32 weights and 8-bit activations, as the gguf precision's "
        "Q4_K tensors",
        devices=("cpu",),
    ),
}
# Of those, the ones whose blocks are read from the model's GGUF file (they need one).
FILE_PRECISIONS = ("gguf",)


@dataclass(frozen=True)
class LogitAgreement:
    """How close one set of logits is to a reference (both shaped [..., vocab])."""

    max_abs_over_std: float  # max |logits - reference| over all positions / std of the reference
    top1_agreement: float  # fraction of positions with the same argmax
    positions: int


def compare_logits(logits: torch.Tensor, reference: torch.Tensor) -> LogitAgreement:
    """Compare logits with a reference; dividing by the reference std makes the number scale-free, so
    one tolerance fits random-init models (tiny logits) and real ones (logits of tens)."""
    if logits.shape != reference.shape:
        raise ValueError(f"logits shape {tuple(logits.shape)} != reference {tuple(reference.shape)}")
    test = logits.detach().float().reshape(-1, logits.shape[-1])
    ref = reference.detach().float().reshape(-1, reference.shape[-1])
    std = ref.std().clamp_min(torch.finfo(torch.float32).tiny)
    return LogitAgreement(
        max_abs_over_std=float((test - ref).abs().max() / std),
        top1_agreement=float((test.argmax(-1) == ref.argmax(-1)).float().mean()),
        positions=ref.shape[0],
    )


# ---------------------------------------------------------------------------------------------------
# Kernel probes: tiny calls (microseconds) so that a torch build without a kernel is reported by name
# before any weights load. Cached: the answer cannot change within a process.


def _probe_int4() -> None:
    w = torch.zeros(_INT4_N_MULTIPLE, 64, dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(w, _INT4_INNER_K_TILES)
    sz = torch.zeros(1, _INT4_N_MULTIPLE, 2, dtype=torch.bfloat16)
    torch.ops.aten._weight_int4pack_mm_for_cpu(torch.zeros(1, 64, dtype=torch.bfloat16), packed, 64, sz)


def _probe_int8() -> None:
    w = torch.zeros(4, _INT8_K_MULTIPLE, dtype=torch.int8)
    x = torch.zeros(1, _INT8_K_MULTIPLE, dtype=torch.bfloat16)
    torch.ops.aten._weight_int8pack_mm(x, w, torch.ones(4, dtype=torch.bfloat16))


def _probe_dynamic() -> None:
    engines = torch.backends.quantized.supported_engines
    if not any(e in engines for e in ("x86", "fbgemm", "qnnpack", "onednn")):
        raise RuntimeError(f"no quantized engine (supported_engines={engines})")
    _quantize_dynamic(nn.Sequential(nn.Linear(8, 4)))(torch.zeros(1, 8))


_PROBES = {
    "w4abf16": (_probe_int4, "torch.ops.aten._weight_int4pack_mm_for_cpu"),
    "w8abf16": (_probe_int8, "torch.ops.aten._weight_int8pack_mm"),
    "w8af32": (_probe_dynamic, "torch.ao.quantization.quantize_dynamic (qint8)"),
}


@functools.cache
def _kernel_problem(name: str) -> str | None:
    if name not in _PROBES:
        return None
    probe, kernel = _PROBES[name]
    try:
        probe()
    except (AttributeError, RuntimeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{kernel} is not usable in this torch build ({torch.__version__}): {first}"
    return None


def check_precision(name: str, device: str | torch.device | None = None) -> PrecisionSpec:
    """Return the spec for `name`, or raise UnsupportedError if it is unknown, its kernels are missing
    from this torch build, or (when `device` is given) it has no kernels for that device type.
    Loads no weights, so callers can validate command-line choices first."""
    spec = PRECISIONS.get(name) or BLOCK_PRECISIONS.get(name)
    if spec is None:
        known = ", ".join([*PRECISIONS, *BLOCK_PRECISIONS])
        raise UnsupportedError(f"Unknown precision {name!r}. Choose one of: {known}.")
    problem = _kernel_problem(name)
    if problem is not None:
        others = [p for p in PRECISIONS if _kernel_problem(p) is None]
        raise UnsupportedError(
            f"Precision {name!r} cannot run here: {problem}. "
            f"Use a torch build that has it, or one of: {', '.join(others)}."
        )
    if device is not None:
        from harness.base.devices import check_device

        dev_type = check_device(str(device)).type
        if dev_type not in spec.devices:
            raise UnsupportedError(
                f"Precision {name!r} has kernels only for {', '.join(spec.devices)}, not {dev_type!r}. "
                f"Run it on {spec.devices[0]!r}, or pick a precision that supports {dev_type!r}: "
                f"{', '.join(p for p, s in PRECISIONS.items() if dev_type in s.devices) or 'none'}."
            )
    return spec


def check_group_size(group_size: int) -> int:
    if group_size not in INT4_GROUP_SIZES:
        raise UnsupportedError(
            f"int4 group size {group_size} is not supported by torch's CPU int4 kernel. "
            f"Use one of: {', '.join(map(str, INT4_GROUP_SIZES))} (default {DEFAULT_GROUP_SIZE})."
        )
    return group_size


# ---------------------------------------------------------------------------------------------------
# Quantized linear layers


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _flatten_input(x: torch.Tensor, in_features: int, padded_in: int) -> torch.Tensor:
    # Checked here because the aten kernels do not validate shapes and can read out of bounds.
    if x.shape[-1] != in_features:
        raise ValueError(f"input has {x.shape[-1]} features, layer expects {in_features}")
    x2 = x.reshape(-1, in_features).to(torch.bfloat16)
    if padded_in != in_features:
        x2 = F.pad(x2, (0, padded_in - in_features))
    return x2.contiguous()


def _bias_copy(linear: nn.Linear) -> nn.Parameter | None:
    if linear.bias is None:
        return None
    return nn.Parameter(linear.bias.detach().to(torch.bfloat16).clone(), requires_grad=False)


@dataclass(frozen=True)
class Int4Codes:
    """Group-wise int4 quantization of an [out, in] weight, padded to the kernel's shape rules."""

    q: torch.Tensor  # int32 codes in [0, 15], [out_pad, in_pad]
    scale: torch.Tensor  # float32 (bf16-representable), [out_pad, in_pad / group_size]
    zero: torch.Tensor  # float32 (bf16-representable), same shape; the value of code 8
    group_size: int

    def dequantize(self, out_features: int, in_features: int) -> torch.Tensor:
        """The float32 [out, in] weight that the int4 kernel multiplies by."""
        g = self.group_size
        w = (self.q.float() - 8) * self.scale.repeat_interleave(g, 1) + self.zero.repeat_interleave(g, 1)
        return w[:out_features, :in_features]


def quantize_int4_groupwise(weight: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> Int4Codes:
    """Asymmetric min/max int4 codes per group of `group_size` inputs, in the convention of torch's
    tinygemm-style CPU kernel: code q in [0, 15] means (q - 8) * scale + zero."""
    check_group_size(group_size)
    n, k = weight.shape
    n_pad, k_pad = _round_up(n, _INT4_N_MULTIPLE), _round_up(k, group_size)
    # Zero padding: padded inputs are zero too, so padded columns never contribute.
    w = F.pad(weight.detach().float(), (0, k_pad - k, 0, n_pad - n))
    groups = w.reshape(n_pad, k_pad // group_size, group_size)
    w_min, w_max = groups.amin(-1), groups.amax(-1)
    # Scale and zero are rounded to bf16 (the kernel's format) BEFORE choosing codes, so each code is
    # the nearest one for the values the kernel will actually use.
    scale = ((w_max - w_min) / 15).clamp_min(1e-6).to(torch.bfloat16).float()
    zero = (w_min + 8 * scale).to(torch.bfloat16).float()
    q = ((groups - zero[..., None]) / scale[..., None] + 8).round().clamp(0, 15)
    return Int4Codes(q.to(torch.int32).reshape(n_pad, k_pad), scale, zero, group_size)


def quantize_int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 codes with one scale per output row: returns (codes [out, in_pad] int8, scale
    [out] float32, bf16-representable); code c means c * scale."""
    k = weight.shape[1]
    w = F.pad(weight.detach().float(), (0, _round_up(k, _INT8_K_MULTIPLE) - k))
    # Rounded to bf16 first (the kernel takes bf16 scales), then codes chosen against it.
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-8).to(torch.bfloat16).float()
    q = (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8).contiguous()
    return q, scale


class Int4WeightOnlyLinear(nn.Module):
    """nn.Linear replacement: int4 weights with one (scale, zero) per group of `group_size` inputs,
    bfloat16 activations. Takes any leading dims and any float input dtype; returns bfloat16."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group_size: int,
        weight_packed: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        bias: nn.Parameter | None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = group_size
        self.padded_in = _round_up(in_features, group_size)
        self.padded_out = _round_up(out_features, _INT4_N_MULTIPLE)
        self.register_buffer("weight_packed", weight_packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # [padded_in/group, padded_out, 2]
        self.bias = bias

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = DEFAULT_GROUP_SIZE) -> Int4WeightOnlyLinear:
        codes = quantize_int4_groupwise(linear.weight, group_size)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.q, _INT4_INNER_K_TILES)
        # Kernel layout: [groups, out, 2] holding (scale, zero) pairs.
        sz = torch.stack([codes.scale, codes.zero], dim=-1).transpose(0, 1).to(torch.bfloat16).contiguous()
        return cls(linear.in_features, linear.out_features, group_size, packed, sz, _bias_copy(linear))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = _flatten_input(x, self.in_features, self.padded_in)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x2, self.weight_packed, self.group_size, self.scales_and_zeros.to(torch.bfloat16)
        )
        if self.padded_out != self.out_features:
            y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias.to(torch.bfloat16)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, bias={self.bias is not None}"
        )


class Int8WeightOnlyLinear(nn.Module):
    """nn.Linear replacement: int8 weights with one symmetric scale per output channel, bfloat16
    activations. Takes any leading dims and any float input dtype; returns bfloat16."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        weight_int8: torch.Tensor,
        scales: torch.Tensor,
        bias: nn.Parameter | None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.padded_in = weight_int8.shape[1]
        self.register_buffer("weight_int8", weight_int8)  # [out, padded_in]
        self.register_buffer("scales", scales)  # [out], bf16
        self.bias = bias

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8WeightOnlyLinear:
        q, scale = quantize_int8_per_channel(linear.weight)
        return cls(linear.in_features, linear.out_features, q, scale.to(torch.bfloat16), _bias_copy(linear))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = _flatten_input(x, self.in_features, self.padded_in)
        y = torch.ops.aten._weight_int8pack_mm(x2, self.weight_int8, self.scales.to(torch.bfloat16))
        if self.bias is not None:
            y = y + self.bias.to(torch.bfloat16)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


# ---------------------------------------------------------------------------------------------------
# Whole models


def _dynamic_linear_type() -> type[nn.Module]:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    return DynamicQuantizedLinear


def _quantize_dynamic(model: nn.Module) -> nn.Module:
    # torch.ao.quantization is deprecated in favour of torchao, but it is still the seeds' exact
    # "w8af32" and still works in torch 2.13; its deprecation warnings would only add noise to every run.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def linear_format(module: nn.Module) -> str | None:
    """Weight format of a linear layer (plain or quantized), or None if `module` is not one."""
    if isinstance(module, Int4WeightOnlyLinear):
        return f"int4-g{module.group_size}"
    if isinstance(module, Int8WeightOnlyLinear):
        return "int8"
    if isinstance(module, _dynamic_linear_type()):
        return "int8-dynamic"
    if isinstance(module, nn.Linear):
        return _dtype_name(module.weight.dtype)
    return None


def describe(model: nn.Module) -> dict[str, dict[str, int]]:
    """Count layers by weight format, to prove which precision a model really runs in.

    `linear`: linear layers (lm_head included) by format, e.g. {"int4-g64": 169};
    `embedding`: nn.Embedding layers by dtype; `other_params`: number of parameter tensors outside
    linear and embedding layers (norms, mostly) by dtype."""
    linear: Counter[str] = Counter()
    embedding: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for module in model.modules():
        fmt = linear_format(module)
        if fmt is not None:
            linear[fmt] += 1
            params = []
        elif isinstance(module, nn.Embedding):
            embedding[_dtype_name(module.weight.dtype)] += 1
            params = [p for n, p in module.named_parameters(recurse=False) if n != "weight"]
        else:
            params = list(module.parameters(recurse=False))
        for p in params:
            other[_dtype_name(p.dtype)] += 1
    return {"linear": dict(linear), "embedding": dict(embedding), "other_params": dict(other)}


def untie_output_embeddings(model: nn.Module) -> bool:
    """Give lm_head its own weight if it shares the input embedding's; True if it did.

    Quantizing lm_head replaces its module, and converting the rest casts the embedding: with one
    shared Parameter either could reach the other. The config flag is cleared too, so a later
    `model.tie_weights()` does not re-tie a quantized lm_head to the embedding."""
    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    if get_out is None or get_in is None:
        return False
    out, inp = get_out(), get_in()
    if not isinstance(out, nn.Linear) or not isinstance(inp, nn.Embedding):
        return False
    if out.weight.data_ptr() != inp.weight.data_ptr():
        return False
    out.weight = nn.Parameter(inp.weight.detach().clone(), requires_grad=False)
    config = getattr(model, "config", None)
    if config is not None:
        config.tie_word_embeddings = False
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else None
        if text_config is not None and text_config is not config:
            text_config.tie_word_embeddings = False
    tied_keys = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied_keys, dict):
        tied_keys.clear()
    return True


def _replace_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    targets = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(linear))
    return len(targets)


def _quantized_formats(model: nn.Module) -> set[str]:
    formats = describe(model)["linear"]
    return {f for f in formats if f.startswith("int")}


def apply_precision(model: nn.Module, name: str, *, group_size: int = DEFAULT_GROUP_SIZE) -> nn.Module:
    """Convert `model` (a float model on CPU) to precision `name` in place and return it.

    fp32/bf16 cast every parameter. w8af32 casts to fp32 and runs quantize_dynamic on every
    nn.Linear. w4abf16/w8abf16 replace every nn.Linear (lm_head included) with the weight-only
    module and cast everything else (embeddings, norms) to bf16. Quantization reads the weights as
    they are, so convert from fp32 weights for the best accuracy."""
    check_precision(name)
    if name == "w4abf16":
        check_group_size(group_size)
    already = _quantized_formats(model)
    if already:
        raise UnsupportedError(
            f"The model is already quantized ({', '.join(sorted(already))}); precisions cannot be "
            f"stacked. Load the float weights again and apply {name!r} to them."
        )
    if name in ("fp32", "bf16"):
        return model.to(PRECISIONS[name].torch_dtype)
    if not any(type(m) is nn.Linear for m in model.modules()):
        raise UnsupportedError(
            f"Precision {name!r} quantizes nn.Linear layers and this model "
            f"({type(model).__name__}) has none; use fp32 or bf16 for it."
        )
    untie_output_embeddings(model)
    if name == "w8af32":
        return _quantize_dynamic(model.to(torch.float32))
    if name == "w4abf16":
        _replace_linears(model, lambda lin: Int4WeightOnlyLinear.from_linear(lin, group_size))
    else:
        _replace_linears(model, Int8WeightOnlyLinear.from_linear)
    return model.to(torch.bfloat16)
