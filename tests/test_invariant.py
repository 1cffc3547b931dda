"""Batch-invariant target kernels: each row of an M-token forward equals the one-token row, bit for bit.

The kernels are compiled on first use (about a minute, once per machine; cached afterwards).
"""

from __future__ import annotations

import pytest
import torch
from helpers import load_pair
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.base.errors import HarnessError, UnsupportedError
from harness.experiments import row_divergence
from harness.kernels import invariant
from harness.pairs import models
from harness.settings import precision
from harness.weights import tiny

PRECISIONS = ("fp32", "bf16", "w8abf16", "w4abf16", "w8af32")
FAMILIES = ("tiny-opt", "tiny-llama", "tiny-codellama", "tiny-qwen2")


@pytest.fixture(scope="module")
def ext():
    return invariant.extension()


def _weights(kind: str, n: int, k: int, group: int = 64) -> tuple[invariant._Weights, torch.Tensor]:
    """Weights of one kind and the float matrix they stand for."""
    torch.manual_seed(n * 1000 + k)
    w = torch.randn(n, k)
    if kind == "f32":
        return invariant._Weights("f32", w), w
    if kind == "bf16":
        b = w.to(torch.bfloat16)
        return invariant._Weights("bf16", b), b.float()
    if kind == "i8":
        q, scale = precision.quantize_int8_per_channel(w)
        return invariant._Weights("i8", q[:, :k].contiguous(), scale), q[:, :k].float() * scale[:, None]
    if kind == "i8a8":
        q, scale = precision.quantize_int8_per_channel(w)
        return invariant._i8a8_weights(w), q[:, :k].float() * scale[:, None]
    codes = precision.quantize_int4_groupwise(w, group)
    scale, zero, q = codes.scale[:n], codes.zero[:n], codes.q[:n, :k]
    offset = (zero - 8 * scale).contiguous()
    packed = invariant._pack_int4(q)
    dense = (q.float().reshape(n, k // group, group) * scale[..., None] + offset[..., None]).reshape(n, k)
    return invariant._Weights("i4", packed, scale.contiguous(), offset, group), dense


@pytest.mark.parametrize("kind,k", [("f32", 100), ("bf16", 77), ("i8", 72), ("i4", 128), ("f32", 1536)])
def test_kernel_computes_the_matrix_product(ext, kind, k):
    weights, dense = _weights(kind, 48, k)
    layer = invariant.InvariantLinear(k, 48, weights, torch.randn(48))
    x = torch.randn(5, k)
    expected = x.double() @ dense.double().T + layer.bias.double()
    got = layer(x)
    # float32 accumulation over k terms of unit-variance products: error ~ sqrt(k) * 2^-24 * |terms|.
    assert torch.allclose(got.double(), expected, atol=1e-4 * k**0.5, rtol=1e-5)


def _i8a8_reference(x: torch.Tensor, weights: invariant._Weights, n: int) -> torch.Tensor:
    """What the int8 x int8 kernel promises, written with torch ops: each row quantized on its own
    (asymmetric uint8, zero point from the row's range), exact integer products, one float
    epilogue per output."""
    lo, hi = x.clamp(max=0).amin(1), x.clamp(min=0).amax(1)
    s = (hi - lo) / 255
    s_safe = torch.where(s > 0, s, torch.ones_like(s))
    z = torch.where(s > 0, torch.clamp(torch.round(-lo / s_safe), 0, 255), torch.zeros_like(s))
    q = torch.where(s[:, None] > 0, torch.clamp(torch.round(x / s_safe[:, None]) + z[:, None], 0, 255), 0)
    packed = weights.data
    w = packed.permute(0, 2, 1, 3).reshape(packed.shape[0] * 16, -1)[:n, : x.shape[1]]
    acc = (q.double() @ w.double().T).to(torch.int64)  # exact: every partial sum is below 2^53
    d = acc - z.to(torch.int64)[:, None] * weights.offset.to(torch.int64)[None]
    return d.float() * (s[:, None] * weights.scale[None])


@pytest.mark.parametrize("m,n,k", [(1, 48, 1536), (9, 40, 100), (5, 16, 64), (3, 7, 8960), (17, 33, 200)])
def test_int8_activation_kernel_is_the_exact_integer_product(ext, m, n, k):
    weights, dense = _weights("i8a8", n, k)
    x = torch.randn(m, k)
    x[0, :] = 0.0  # an all-zero row (scale 0) must come out 0
    got = ext.linear_i8a8(x, weights.data, weights.scale, weights.offset)
    assert torch.equal(got, _i8a8_reference(x, weights, n))
    assert torch.equal(got[0], torch.zeros(n))
    # The fallback for CPUs without AVX-512 VNNI sums the same integers: same bits.
    assert torch.equal(got, ext.linear_i8a8(x, weights.data, weights.scale, weights.offset, force_avx2=True))
    # And it is a matmul: within int8 rounding of x @ dense.T (per-row 8-bit activations).
    expected = x @ dense.T
    assert (got - expected).abs().max() <= 0.03 * expected.abs().max()


def test_int8_activation_kernel_propagates_non_finite_rows(ext):
    weights, _ = _weights("i8a8", 16, 64)
    x = torch.randn(3, 64)
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    got = ext.linear_i8a8(x, weights.data, weights.scale, weights.offset)
    assert torch.isfinite(got[0]).all()
    assert torch.isnan(got[1]).all() and torch.isnan(got[2]).all()


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["f32", "bf16", "i8", "i8a8", "i4"]),
    m=st.integers(1, 17),
    n=st.integers(1, 40),
    k_units=st.integers(1, 5),
    threads=st.sampled_from([1, 2]),
)
def test_kernel_rows_do_not_depend_on_the_batch(ext, kind, m, n, k_units, threads):
    k = k_units * 64 + (0 if kind == "i4" else k_units * 3)  # odd K exercises the scalar tail
    weights, _ = _weights(kind, n, k)
    layer = invariant.InvariantLinear(k, n, weights, None)
    x = torch.randn(m, k)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        batched = layer(x)
        rows = [layer(x[i : i + 1]) for i in range(m)]
    finally:
        torch.set_num_threads(before)
    for i, row in enumerate(rows):
        assert torch.equal(batched[i : i + 1], row), f"row {i} of {m} differs from its one-row call"


def _call(ext, weights: invariant._Weights, x: torch.Tensor, force_avx2: bool) -> torch.Tensor:
    if weights.kind == "f32":
        return ext.linear_f32(x, weights.data, force_avx2=force_avx2)
    if weights.kind == "bf16":
        return ext.linear_bf16(x, weights.data, force_avx2=force_avx2)
    if weights.kind == "i8":
        return ext.linear_i8(x, weights.data, weights.scale, force_avx2=force_avx2)
    return ext.linear_i4(x, weights.data, weights.scale, weights.offset, weights.group_size, force_avx2)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["f32", "bf16", "i8", "i4"]),
    m=st.integers(1, 14),
    n=st.integers(1, 70),
    k_units=st.integers(1, 4),
)
def test_avx512_and_avx2_paths_give_the_same_bits(ext, kind, m, n, k_units):
    """The AVX-512 path reblocks (up to 6 rows x 8 columns per cell) but keeps every output's order,
    so a machine with AVX-512 decodes exactly what one with only AVX2 decodes."""
    if ext.float_isa() != "avx512":
        pytest.skip("this CPU has no AVX-512 (f, bw, vl, dq): only the AVX2 path exists here")
    k = k_units * 64 + (0 if kind == "i4" else 5 * k_units)  # odd K exercises the scalar tail
    weights, _ = _weights(kind, n, k)
    x = torch.randn(m, k)
    assert torch.equal(_call(ext, weights, x, False), _call(ext, weights, x, True))


def test_int4_packing_puts_codes_where_the_kernel_reads_them():
    codes = torch.arange(32, dtype=torch.int32).remainder(16).reshape(1, 32)
    packed = invariant._pack_int4(codes)
    # Byte i of each 16-code run: code i in the low nibble, code i + 8 in the high one.
    assert packed.shape == (1, 16)
    assert [int(b) & 15 for b in packed[0, :8]] == list(range(8))
    assert [int(b) >> 4 for b in packed[0, :8]] == list(range(8, 16))


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("prec", PRECISIONS)
def test_every_op_is_row_invariant_on_the_invariant_path(ext, name, prec):
    model = invariant.apply_precision(tiny.build_target(name), prec)
    ids = list(range(3, 45))
    for m in (2, 5, 9):
        report = row_divergence.row_divergence(model, ids, m)
        assert {d.op for d in report} >= {"logits", "InvariantLinear"}
        inexact = [d for d in report if not d.exact]
        assert not inexact, f"{name} {prec} M={m}: rows differ from one-token rows: {inexact}"


def test_row_divergence_sees_a_batch_dependent_op(ext):
    """The measurement must be able to fail: a layer that mixes rows (adds the batch mean) is seen."""
    model = invariant.apply_precision(tiny.build_target("tiny-llama"), "fp32")
    layer = model.model.layers[0].mlp

    def mix(_module, _args, out):
        return out + 1e-3 * out.mean(dim=1, keepdim=True)

    handle = layer.register_forward_hook(mix)
    try:
        report = {d.op: d for d in row_divergence.row_divergence(model, list(range(3, 30)), 4)}
    finally:
        handle.remove()
    assert not report["logits"].exact
    assert not report["LlamaMLP"].exact


def test_invariant_path_keeps_the_stock_weight_values(ext):
    """Only the arithmetic order changes: one-token logits stay close to the stock precision's."""
    for prec in PRECISIONS:
        stock = precision.apply_precision(tiny.build_target("tiny-qwen2"), prec)
        inv = invariant.apply_precision(tiny.build_target("tiny-qwen2"), prec)
        ids = torch.tensor([list(range(3, 20))])
        with torch.inference_mode():
            a, b = stock(ids).logits.float(), inv(ids).logits.float()
        agreement = precision.compare_logits(b, a)
        # Same weights, other rounding: fp32 only reorders sums; bf16 formats round activations
        # at different points (bf16's own tolerance vs fp32); w8af32 differs by design (stock
        # rounds activations to int8 with one scale per call and per-tensor weight scales,
        # invariant with one scale per row and per-channel weight scales).
        limit = {"fp32": 1e-4, "w8af32": 1.0}.get(prec, precision.PRECISIONS["bf16"].logit_tolerance)
        assert agreement.max_abs_over_std < limit, f"{prec}: {agreement}"


def test_load_pair_with_invariant_kernels(ext):
    pair = load_pair("tiny-qwen2", target_precision="w8abf16", target_kernels="invariant")
    assert pair.target_setup.kernels == "invariant"
    kinds = {m.kind for m in pair.target.modules() if isinstance(m, invariant.InvariantLinear)}
    assert kinds == {"i8"}
    assert not any(isinstance(m, torch.nn.Linear) for m in pair.target.modules())
    # The draft is untouched: its speed matters, not its batch invariance.
    assert not any(isinstance(m, invariant.InvariantLinear) for m in pair.draft.modules())


def test_bad_kernel_settings_fail_clearly(monkeypatch):
    with pytest.raises(HarnessError, match="choose one of stock, invariant"):
        load_pair("tiny-qwen2", target_kernels="fast")
    # As if this machine had a GPU: the device passes its own check, the kernels refuse it.
    monkeypatch.setattr(models.devices, "check_device", lambda name: torch.device(name))
    with pytest.raises(UnsupportedError, match="CPU only"):
        load_pair("tiny-qwen2", target_kernels="invariant", target_device="cuda")


def test_attention_refuses_batches(ext):
    model = invariant.apply_precision(tiny.build_target("tiny-llama"), "fp32")
    with pytest.raises(UnsupportedError, match="batch size 1"), torch.inference_mode():
        model(torch.tensor([[3, 4, 5], [6, 7, 8]]))


@settings(max_examples=20, deadline=None)
@given(
    heads=st.sampled_from([(4, 4), (6, 2), (12, 2), (4, 1)]),
    m=st.integers(1, 9),
    extra=st.integers(0, 150),  # past one and two key tiles (64 keys), whose value rows are read ahead
    d=st.sampled_from([8, 64, 72]),
    seed=st.integers(0, 2**16),
)
def test_attention_rows_are_causal_sdpa_and_do_not_depend_on_m(ext, heads, m, extra, d, seed):
    """One call for M query rows: each row equals the same row computed alone over its own prefix
    (bit for bit) and causal SDPA with grouped heads (to rounding)."""
    h, hkv = heads
    g = torch.Generator().manual_seed(seed)
    length = m + extra
    q = torch.randn(h, m, d, generator=g)
    k = torch.randn(hkv, length, d, generator=g)
    v = torch.randn(hkv, length, d, generator=g)
    out = ext.attention_rows(q, k, v, d**-0.5)
    # This host's choice, the 8-lane passes and (where the CPU has AVX-512) the 16-lane ones: the
    # same bits, so a host that takes either decodes what the other does.
    assert torch.equal(out, ext.attention_rows(q, k, v, d**-0.5, variant=0))
    assert torch.equal(out, ext.attention_rows(q, k, v, d**-0.5, variant=1))
    for i in range(m):
        end = length - m + i + 1
        alone = ext.attention_rows(q[:, i : i + 1].contiguous(), k[:, :end], v[:, :end], d**-0.5)
        assert torch.equal(alone[:, 0], out[:, i])
    mask = torch.ones(m, length, dtype=torch.bool).tril(length - m)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q[None],
        k.repeat_interleave(h // hkv, 0)[None],
        v.repeat_interleave(h // hkv, 0)[None],
        attn_mask=mask,
    )[0]
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)


def test_a_second_checkout_of_the_same_kernels_does_not_rebuild_them(tmp_path) -> None:
    """The build is keyed by the sources' content and flags, not their path: a checkout elsewhere
    (sharing the cache) loads the module built from the first, compiling nothing."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from harness.kernels import cppext
    from harness.weights import packaged

    invariant.extension()  # built (or found) from this checkout
    folder = packaged.cache_root() / "kernels" / f"torch-{torch.__version__}"
    # Only this module's builds: other kernels may be compiling beside it in a parallel run.
    pattern = "assisted_generation_invariant-*/**/*"
    before = {p: p.stat().st_mtime_ns for p in folder.glob(pattern) if p.is_file()}
    moved = tmp_path / "elsewhere" / "kernels"
    shutil.copytree(Path(invariant._SOURCE).parent, moved)
    assert cppext.build_key(moved / "invariant.cpp") == cppext.build_key(invariant._SOURCE)
    code = (
        "import sys; from pathlib import Path; from harness.kernels import cppext; "
        "cppext.build('assisted_generation_invariant', Path(sys.argv[1]))"
    )
    subprocess.run([sys.executable, "-c", code, str(moved / "invariant.cpp")], check=True, timeout=300)
    after = {p: p.stat().st_mtime_ns for p in folder.glob(pattern) if p.is_file()}
    assert after == before  # no new build folder, no file rewritten
