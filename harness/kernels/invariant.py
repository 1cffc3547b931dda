"""Batch-invariant target kernels: every row of a K+1-token verification equals a one-token step.

Why a hand-written path: with stock kernels a forward over M tokens does not compute a row the way
a forward over one token does. BLAS switches from gemv (M=1) to gemm (M>1), which sums in another
order, so an argmax that is nearly tied flips between plain decoding and assisted verification
(measured by ``harness.experiments.row_divergence``). No library offers CPU kernels whose reduction
order is independent of M (the batch-invariant kernels published for GPUs are Triton), so this
module provides them:

- linear layers (every projection and the output layer): ``harness/kernels/invariant.cpp``, one
  fixed reduction order per output element for fp32, bf16, int8 and int4 weights, float32
  accumulation; compiled once with torch's C++ extension loader and cached;
- attention: ``attention_rows`` in the same file computes every query row over its own prefix in
  one fixed order, whatever the number of rows, so a verification row runs exactly the decode
  step's attention;
- everything else in a decoder layer (norms, rotary, activations, residuals) is row-wise already;
  ``harness.experiments.row_divergence`` measures that instead of assuming it.

``make_batch_invariant`` converts a model after its precision was applied, keeping the precision's
weights (the same bf16 values, int8 codes or int4 codes and scales) so only the arithmetic order
changes. The plain reference of a converted target is its own one-token decoding, which is what
the invariant path reproduces exactly; how far that reference moves from the stock kernels' output
is measured, not assumed (``perf/test_decode.py`` and the README).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from harness.base import platforms
from harness.base.errors import HarnessError, UnsupportedError
from harness.kernels import cppext
from harness.settings import precision

KERNELS = ("stock", "invariant")
ATTENTION_NAME = "batch_invariant_sdpa"
_SOURCE = Path(__file__).with_name("invariant.cpp")
# The int4 kernel dequantizes 16 codes per step (two nibbles per byte, see _pack_int4).
_INT4_STEP = 16


def check_kernels(name: str, flag: str = "--target_kernels") -> str:
    if name not in KERNELS:
        raise HarnessError(f"unknown {flag} {name!r}; choose one of {', '.join(KERNELS)}")
    if name == "invariant":
        cpu = platforms.cpu_flags()
        if cpu is not None and not {"avx2", "fma"} <= cpu:
            raise UnsupportedError(
                f"{flag} invariant needs a CPU with AVX2 and FMA (this one lacks them); use {flag} stock"
            )
    return name


@functools.cache
def extension():
    """The compiled kernels (built on first use, ~1-2 min, then loaded from the cache in ~1 s)."""
    return cppext.build("assisted_generation_invariant", _SOURCE)


# --------------------------------------------------------------------------- linear layers


def _pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes 0..15 -> [N, K/2] bytes; in every run of 16 codes, byte i holds code i (low
    nibble) and code i+8 (high nibble), so the kernel unpacks 8 + 8 lanes with one load."""
    n, k = codes.shape
    c = codes.to(torch.uint8).reshape(n, k // _INT4_STEP, 2, 8)
    return (c[:, :, 0, :] | (c[:, :, 1, :] << 4)).reshape(n, k // 2).contiguous()


@dataclass
class _Weights:
    kind: str  # "f32" | "bf16" | "i8" | "i8a8" | "i4"
    data: torch.Tensor
    scale: torch.Tensor | None = None  # i8, i8a8: [N]; i4: [N, K/group]
    offset: torch.Tensor | None = None  # i4: [N, K/group], zero - 8 * scale; i8a8: [N] int32 code sums
    group_size: int = 0


# The int8 x int8 kernel consumes 64 codes per instruction (AVX-512 VNNI); rows are zero-padded.
_I8A8_K_MULTIPLE = 64


def _i8a8_weights(weight: torch.Tensor) -> _Weights:
    """Per-output-row symmetric int8 codes (the stock precisions' own, see
    ``precision.quantize_int8_per_channel``), zero-padded to a multiple of 64, and their sums."""
    q, scale = precision.quantize_int8_per_channel(weight)
    q = q[:, : weight.shape[1]]
    pad = -weight.shape[1] % _I8A8_K_MULTIPLE
    q = torch.nn.functional.pad(q, (0, pad))
    wsum = q.sum(dim=1, dtype=torch.int32).contiguous()
    # The kernel's layout: [N/16, Kp/4, 16, 4] (16 columns x 4 inputs per 64-byte load).
    n, kp = q.shape
    q = torch.nn.functional.pad(q, (0, 0, 0, -n % 16))
    packed = q.reshape(-1, 16, kp // 4, 4).permute(0, 2, 1, 3).contiguous()
    return _Weights("i8a8", packed, scale.contiguous(), wsum)


class InvariantLinear(nn.Module):
    """nn.Linear replacement running the batch-invariant kernel; returns the input's dtype."""

    def __init__(
        self, in_features: int, out_features: int, weights: _Weights, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.kind = weights.kind
        self.group_size = weights.group_size
        # i8a8 takes x unpadded: it quantizes each row into a zero-padded buffer itself.
        self.padded_in = (
            in_features
            if weights.kind == "i8a8"
            else weights.data.shape[1] * (2 if weights.kind == "i4" else 1)
        )
        self.register_buffer("weight_data", weights.data)
        self.register_buffer("weight_scale", weights.scale)
        self.register_buffer("weight_offset", weights.offset)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, dtype = x.shape[:-1], x.dtype
        x2 = x.reshape(-1, self.in_features).float()
        if self.padded_in != self.in_features:
            x2 = torch.nn.functional.pad(x2, (0, self.padded_in - self.in_features))
        x2 = x2.contiguous()
        ext = extension()
        if self.kind == "f32":
            y = ext.linear_f32(x2, self.weight_data)
        elif self.kind == "bf16":
            y = ext.linear_bf16(x2, self.weight_data)
        elif self.kind == "i8":
            y = ext.linear_i8(x2, self.weight_data, self.weight_scale)
        elif self.kind == "i8a8":
            y = ext.linear_i8a8(x2, self.weight_data, self.weight_scale, self.weight_offset)
        else:
            y = ext.linear_i4(x2, self.weight_data, self.weight_scale, self.weight_offset, self.group_size)
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.kind}"


def _invariant_linear(linear: nn.Linear, name: str, group_size: int) -> InvariantLinear:
    """The invariant twin of a float linear layer at precision ``name``, quantized with the same
    functions as the stock precision (``harness.settings.precision``), so the weight values are the stock
    ones (w8af32 aside: see ``apply_precision``)."""
    w = linear.weight.detach()
    if name == "fp32":
        weights = _Weights("f32", w.float().contiguous())
    elif name == "bf16":
        weights = _Weights("bf16", w.to(torch.bfloat16).contiguous())
    elif name == "w8af32":
        weights = _i8a8_weights(w)
    elif name == "w8abf16":
        q, scale = precision.quantize_int8_per_channel(w)
        weights = _Weights("i8", q, scale.contiguous())
    elif name == "w4abf16":
        codes = precision.quantize_int4_groupwise(w, group_size)
        n = linear.out_features
        scale = codes.scale[:n].contiguous()
        weights = _Weights(
            "i4",
            _pack_int4(codes.q[:n]),
            scale,
            (codes.zero[:n] - 8 * scale).contiguous(),
            group_size,
        )
    else:
        raise UnsupportedError(f"no batch-invariant kernel for precision {name!r}")
    return InvariantLinear(linear.in_features, linear.out_features, weights, linear.bias)


# --------------------------------------------------------------------------- attention


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """All query rows in one call of the C++ kernel, each row attending to its own prefix in one
    fixed order (``attention_rows`` in invariant.cpp): the row a verification computes is the row
    a decode step computes. Batch size 1 without padding (what assisted generation runs), so the
    mask is implied by the positions and not read."""
    if query.shape[0] != 1:
        raise UnsupportedError("batch-invariant attention runs one sequence at a time (batch size 1)")
    if dropout:
        raise UnsupportedError("batch-invariant attention runs inference only (no dropout)")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    dtype = query.dtype
    out = extension().attention_rows(query[0].float(), key[0].float(), value[0].float(), float(scale))
    # transformers expects [batch, rows, heads, head_dim]
    return out.to(dtype).transpose(0, 1).unsqueeze(0), None


@functools.cache
def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, _attention)
    # The mask is not read (see _attention), but transformers builds one per forward by name.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def apply_precision(
    model: nn.Module, name: str, *, group_size: int = precision.DEFAULT_GROUP_SIZE
) -> nn.Module:
    """Convert a float model (in place) to precision ``name`` on the batch-invariant path.

    Weights are quantized exactly as the stock precision does (same codes and scales), activations
    between layers keep the precision's dtype. w8af32 is dynamic quantization on both
    paths (int8 weights, activations rounded to int8 at every layer), with one difference by
    design: stock w8af32 takes one activation scale per call, which makes every row depend on the
    others in the call; the invariant w8af32 takes one scale per row (for a one-token step the
    two are the same rule) and per-output-row weight scales, and sums in int32, which is exact."""
    precision.check_precision(name)
    if name == "w4abf16":
        precision.check_group_size(group_size)
    extension()  # build or load before touching the model, so a missing compiler fails cleanly
    # lm_head becomes an InvariantLinear: a shared Parameter would tie it back to the embedding.
    precision.untie_output_embeddings(model)
    # Quantize from the weights as loaded (float32 for the best accuracy, as the stock path does),
    # cast the rest of the model, then put the twins in: casting after would round their float32
    # scales to the activation dtype.
    twins = [
        (parent, child_name, _invariant_linear(child, name, group_size))
        for parent in model.modules()
        for child_name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    if not twins:
        raise UnsupportedError(f"{type(model).__name__} has no linear layers to make batch-invariant")
    model.to(precision.PRECISIONS[name].torch_dtype)
    for parent, child_name, twin in twins:
        setattr(parent, child_name, twin)
    use_invariant_attention(model)
    return model


def use_invariant_attention(model: nn.Module) -> None:
    """Switch ``model`` to the batch-invariant attention below (every other op is row-wise)."""
    _register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
