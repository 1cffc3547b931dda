"""The ``gguf`` precision's k-quant kernels: exact against a reference, batch-invariant, both ISAs."""

from __future__ import annotations

import os
import resource
import signal

import gguf
import numpy as np
import pytest
import torch
from helpers import load_pair
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.base.errors import HarnessError
from harness.kernels import kquants
from harness.weights import tiny

KINDS = ("Q4_K", "Q6_K")


def random_blocks(kind: str, n: int, nb: int, seed: int = 0) -> np.ndarray:
    """Any bytes are a valid block once its float16 scales are finite: the file's own format."""
    rng = np.random.default_rng(seed)
    size = kquants.BLOCK_BYTES[kind]
    raw = rng.integers(0, 256, size=(n, nb, size), dtype=np.uint8)
    scales = (rng.random((n, nb, 2)) * 0.02).astype(np.float16).view(np.uint8).reshape(n, nb, 4)
    if kind == "Q4_K":
        raw[..., 0:4] = scales
    else:
        raw[..., 208:210] = scales[..., 0:2]
    return raw.reshape(n, nb * size)


def reference(kind: str, raw: np.ndarray, x: torch.Tensor) -> np.ndarray:
    """Dequantize-and-multiply spelled out with the kernels' own activation codes and arithmetic:
    per block and column, integer sums (codes x activations x sub-block scale; min or scale x the
    activations' sub-block sums), then float32 steps block after block, v - o at the end (numpy
    spells each IEEE float32 step)."""
    codes = kquants.decode(kind, raw)
    q, ad = (t.numpy() for t in kquants.extension().quantize_act(x))
    m, k = q.shape
    n, nb = codes.codes.shape[0], k // kquants.QK
    a = q.reshape(m, nb, kquants.QK).astype(np.int64)
    if kind == "Q4_K":
        sub, scale, off, fo_mult = 32, codes.scales, codes.mins, codes.dmin
    else:
        sub, scale, off, fo_mult = 16, codes.scales, codes.scales, np.float32(32.0) * codes.d
    per = kquants.QK // sub
    wq = codes.codes.reshape(n, nb, per, sub).astype(np.int64) * scale.reshape(n, nb, per, 1).astype(np.int64)
    isum = np.einsum("nbjs,mbjs->mnb", wq, a.reshape(m, nb, per, sub))
    asum = a.reshape(m, nb, per, sub).sum(-1)
    imin = np.einsum("nbj,mbj->mnb", off.reshape(n, nb, per).astype(np.int64), asum)
    v = np.zeros((m, n), dtype=np.float32)
    o = np.zeros((m, n), dtype=np.float32)
    for b in range(nb):
        v = v + isum[:, :, b].astype(np.float32) * (ad[:, None, b] * codes.d[None, :, b])
        o = o + imin[:, :, b].astype(np.float32) * (ad[:, None, b] * fo_mult[None, :, b])
    return v - o


def layer(kind: str, n: int, nb: int, seed: int = 0) -> tuple[np.ndarray, kquants.KQuantLinear]:
    raw = random_blocks(kind, n, nb, seed)
    return raw, kquants.KQuantLinear.from_raw(kind, raw)


@pytest.mark.parametrize("kind", KINDS)
def test_decoding_matches_gguf_dequantize(kind):
    """The codes, scales and mins read from the blocks give ggml's own dequantized values."""
    raw = random_blocks(kind, 5, 3)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    expected = gguf.quants.dequantize(raw, qtype)
    np.testing.assert_allclose(kquants.dequantize(kquants.decode(kind, raw)), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", KINDS)
# the host's AVX-512 path with a one-row pass's near prefetch and without (each host kind runs one of
# them), and the AVX2 path
@pytest.mark.parametrize(
    "force_avx2, one_row_near",
    [(False, False), (False, True), (True, None)],
    ids=["avx512", "avx512-near", "avx2"],
)
# rows a pass over the weights for m = 1, 5, 8, 13 (one row: a decoding step's): AVX-512 1, 5, 8,
# 7 + 6; AVX2 1, 3 + 2, 4 + 4, 4 + 3 + 3 + 3
@pytest.mark.parametrize("m", [1, 5, 8, 13])
def test_kernel_equals_reference_bit_for_bit(kind, force_avx2, one_row_near, m):
    raw, lin = layer(kind, 37, 3)
    x = torch.randn(m, 3 * kquants.QK, generator=torch.Generator().manual_seed(1)) * 3
    y = lin(x, force_avx2=force_avx2, one_row_near=one_row_near)
    assert np.array_equal(y.numpy(), reference(kind, raw, x))
    # and close to the float product (the activation's int8 rounding is the only difference)
    w = torch.from_numpy(kquants.dequantize(kquants.decode(kind, raw)))
    exact = x @ w.T
    assert float((y - exact).abs().max()) <= 0.02 * float(exact.abs().max())


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    m=st.integers(1, 17),
    n=st.integers(1, 300),
    nb=st.integers(1, 4),
    threads=st.sampled_from([2, 3, 4]),
    seed=st.integers(0, 2**16),
)
def test_rows_do_not_depend_on_batch_threads_or_isa(kind, m, n, nb, threads, seed):
    """A row's output is the same bits in a batch or alone, on AVX2 or AVX-512, and whichever thread
    computes each group of columns (up to 19 groups over up to four threads, which take each other's
    groups as they finish)."""
    _, lin = layer(kind, n, nb, seed)
    x = torch.randn(m, nb * kquants.QK, generator=torch.Generator().manual_seed(seed))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = lin(x)
        torch.set_num_threads(threads)
        batched = lin(x)
        one_by_one = torch.cat([lin(x[i : i + 1]) for i in range(m)])
        # the one-row passes' other prefetch variant than this host's: when rows arrive moves no bit
        other = not kquants.extension().one_row_near()
        one_by_one_other = torch.cat([lin(x[i : i + 1], one_row_near=other) for i in range(m)])
        avx2 = lin(x, force_avx2=True)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(batched, alone)
    assert torch.equal(batched, one_by_one)
    assert torch.equal(batched, one_by_one_other)
    assert torch.equal(batched, avx2)


def spelled_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The activation quantization spelled in numpy float32: per block of 256, d = amax / 127 and
    codes = clip(rint(x * (127 / amax)), -127, 127), rounded half to even; an all-zero block has d 0,
    a block holding inf or NaN d NaN, and both codes 0."""
    m, k = x.shape
    blocks = x.reshape(m, k // kquants.QK, kquants.QK).astype(np.float32)
    codes = np.zeros(blocks.shape, dtype=np.int8)
    d = np.zeros(blocks.shape[:2], dtype=np.float32)
    for i, j in np.ndindex(*d.shape):
        block = blocks[i, j]
        amax = np.abs(block).max()
        if not np.isfinite(block).all():
            d[i, j] = np.nan
        elif amax > 0:
            d[i, j] = amax / np.float32(127)
            inv = np.float32(127) / amax
            codes[i, j] = np.clip(np.rint(block * inv), -127, 127).astype(np.int8)
    return codes.reshape(m, k), d


@given(seed=st.integers(0, 2**16), m=st.integers(1, 5), nb=st.integers(1, 4), exponent=st.integers(-30, 30))
@settings(max_examples=40, deadline=None)
def test_activation_codes_are_the_spelled_quantization(seed, m, nb, exponent):
    """The kernels' activation codes and scales (computed eight lanes at a time) are the scalar
    spelling's, exact halves rounded to even included, whatever the magnitude."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, nb * kquants.QK)) * 10.0**exponent).astype(np.float32)
    x[0, : kquants.QK // 2] = rng.integers(-254, 255, kquants.QK // 2) / 2  # exact halves after scaling
    x[0, 0] = 127.0  # so that block's scale is 1 and its halves stay halves
    if m > 1:
        x[1, : kquants.QK] = 0.0
    if m > 2:
        x[2, 7] = np.inf if seed % 2 else np.nan
    q, d = (t.numpy() for t in kquants.extension().quantize_act(torch.from_numpy(x)))
    codes, scales = spelled_codes(x)
    np.testing.assert_array_equal(q, codes)
    np.testing.assert_array_equal(d, scales)


@pytest.mark.parametrize("kind", KINDS)
def test_non_finite_and_zero_rows(kind):
    _, lin = layer(kind, 8, 2)
    x = torch.randn(3, 2 * kquants.QK)
    x[0] = 0.0
    x[1, 5] = float("nan")
    y = lin(x)
    assert torch.equal(y[0], torch.zeros(8))
    assert torch.isnan(y[1]).all()
    assert torch.isfinite(y[2]).all()
    assert torch.equal(y[2:], lin(x[2:]))


@pytest.mark.parametrize("kind", KINDS)
def test_bytes_read_is_the_packed_blocks(kind):
    """What a forward streams: every block once, in the kernels' layout (a few bytes per block more
    than the file: scales and mins a byte each instead of 6 bits)."""
    n, nb = 32, 3
    _, lin = layer(kind, n, nb)
    assert lin.bytes_read == n * nb * kquants.PACKED_BYTES[kind]
    # the file's 4 or 6 bits per weight, plus decoded scales; d and dmin stay float16
    assert lin.bytes_read <= 1.03 * n * nb * kquants.BLOCK_BYTES[kind]


def test_block_scales_are_kept_as_the_files_float16():
    """d and dmin are stored as float16, so a scale that is not a float16 value is refused, never
    rounded into other weights."""
    codes = kquants.decode("Q4_K", random_blocks("Q4_K", 4, 1))
    kquants.pack(codes)
    codes.d[0, 0] = 0.1  # no float16 is exactly 0.1
    with pytest.raises(kquants.HarnessError, match="float16"):
        kquants.pack(codes)


def test_wrong_shapes_are_refused():
    _, lin = layer("Q4_K", 4, 2)
    with pytest.raises(RuntimeError, match="blocks must be"):
        kquants.extension().linear_q4k(torch.zeros(1, 768), lin.blocks, 4, False)
    with pytest.raises(RuntimeError, match="blocks must be"):
        kquants.extension().linear_q4k(torch.zeros(1, 200), lin.blocks, 4, False)
    with pytest.raises(kquants.HarnessError, match="do not hold"):
        kquants.KQuantLinear("Q4_K", lin.blocks, 4, 600, None)
    with pytest.raises(kquants.HarnessError, match="Q4_K data must be"):
        kquants.decode_q4k(np.zeros((2, 100), dtype=np.uint8))
    with pytest.raises(kquants.UnsupportedError, match="Q5_0"):
        kquants.KQuantLinear.from_raw("Q5_0", np.zeros((2, 22), dtype=np.uint8))


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    m=st.integers(1, 9),
    width=st.integers(1, 3 * kquants.QK),
    seed=st.integers(0, 2**16),
)
def test_a_width_short_of_the_blocks_runs_as_if_zero_padded(kind, m, width, seed):
    """A 0.5B draft's 896-wide rows on 256-blocks: the row is quantized and multiplied as if padded
    with zeros, the same bits as an explicitly padded row, batch-invariant, on both ISAs."""
    nb = -(-width // kquants.QK)
    raw, full = layer(kind, 24, nb, seed)
    blocks = torch.from_numpy(kquants.pack(kquants.decode(kind, raw), width))
    short = kquants.KQuantLinear(kind, blocks, 24, width, None)
    x = torch.randn(m, width, generator=torch.Generator().manual_seed(seed))
    padded = torch.nn.functional.pad(x, (0, nb * kquants.QK - width))
    y = short(x)
    assert torch.equal(y, full(padded))
    assert torch.equal(y, short(x, force_avx2=True))
    assert torch.equal(y, torch.cat([short(x[i : i + 1]) for i in range(m)]))
    # The last record stops after the pair of sub-blocks holding the row's last input: per column
    # and sub-block dropped, Q4_K 32 4-bit codes + a scale + a min, Q6_K 16 6-bit codes + a scale.
    last = width - (nb - 1) * kquants.QK
    sub, sub_bytes = (32, 16 + 2) if kind == "Q4_K" else (16, 12 + 1)
    dropped = (kquants.QK - -(-last // (2 * sub)) * 2 * sub) // sub
    assert full.bytes_read - short.bytes_read == 32 * sub_bytes * dropped


def test_a_draft_row_of_896_reads_three_and_a_half_blocks():
    """The 0.5B draft's rows: 896 inputs on Q4_K blocks read 3.5 records' bytes per column, not 4."""
    w = torch.randn(48, 896, generator=torch.Generator().manual_seed(0)) * 0.02
    blocks = torch.from_numpy(kquants.pack(kquants.quantize_q4k(w), 896))
    assert blocks.shape == (3, kquants.row_bytes("Q4_K", 896))
    assert kquants.row_bytes("Q4_K", 896) == 16 * (3 * 148 + 4 * 18 + 4)
    lin = kquants.KQuantLinear("Q4_K", blocks, 48, 896, None)
    x = torch.randn(3, 896, generator=torch.Generator().manual_seed(1))
    expected = x @ torch.from_numpy(kquants.dequantize(kquants.quantize_q4k(w)))[:, :896].T
    assert float((lin(x) - expected).abs().max()) <= 0.02 * float(expected.abs().max())
    with pytest.raises(kquants.HarnessError, match="does not end in the last"):
        kquants.pack(kquants.quantize_q4k(w), 700)


# --------------------------------------------------------------------------- float weights as Q4_K


def test_quantize_q4k_reproduces_q4k_weights():
    """Weights that are Q4_K values already (a GGUF target's tensors, dequantized) come back as the
    same values: the fit finds the file's own grid."""
    raw = random_blocks("Q4_K", 12, 2, seed=3)
    codes = kquants.decode("Q4_K", raw)
    # as llama.cpp writes them: codes reaching 0 and 15 in every sub-block (nearly always so in real
    # blocks), the largest scale and min of a block at 63 (its d and dmin are that largest / 63)
    c, sc, mn = codes.codes.copy(), codes.scales.copy(), codes.mins.copy()
    c[:, ::32], c[:, 1::32] = 0, 15
    sc[:, ::8], mn[:, ::8] = 63, 63
    codes = kquants.Q4KCodes(c, sc, mn, codes.d, codes.dmin)
    w = kquants.dequantize(codes)
    again = kquants.dequantize(kquants.quantize_q4k(torch.from_numpy(w)))
    np.testing.assert_allclose(again, w, atol=1e-3 * float(np.abs(w).max()))


def test_quantize_q4k_error_and_format():
    """Gaussian weights: codes 0..15, 6-bit scales and mins, float16-exact d and dmin, sub-blocks of
    padding all zero, and the error of a 4-bit grid per 32 weights (below the plain min/max grid's)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, 300, generator=gen) * 0.02
    w[3] = 0.0  # an all-zero row: scales 0, nothing divided by zero
    codes = kquants.quantize_q4k(w)
    assert codes.codes.shape == (40, 512) and codes.codes.max() <= 15
    assert codes.scales.max() <= 63 and codes.mins.max() <= 63
    assert np.array_equal(codes.d, codes.d.astype(np.float16).astype(np.float32))
    assert np.array_equal(codes.dmin, codes.dmin.astype(np.float16).astype(np.float32))
    back = torch.from_numpy(kquants.dequantize(codes))
    assert torch.equal(back[:, 320:], torch.zeros(40, 192))  # sub-blocks of padding only
    assert torch.equal(back[3], torch.zeros(512))
    err = float((back[:, :300] - w).norm() / w.norm())
    x = torch.nn.functional.pad(w, (0, 20)).reshape(40, -1, 32)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    step = ((hi - lo) / 15).clamp_min(1e-12)
    minmax = ((((x - lo) / step).round() * step + lo).reshape(40, -1)[:, :300] - w).norm() / w.norm()
    assert 0.01 < err < float(minmax)


def test_q4k_precision_on_a_model(tmp_path, monkeypatch):
    """A float model on Q4_K blocks: every linear layer replaced, logits within the precision's
    tolerance of fp32, verification rows exact; the blocks cached beside the weights file and read
    back on the next load (no quantization), made again when the weights file changes."""
    from harness.experiments import row_divergence
    from harness.pairs import models
    from harness.settings import precision
    from harness.weights import tiny

    def build():
        return tiny.build_target("tiny-qwen2")

    reference = build()
    ids = torch.arange(3, 40).reshape(1, -1)
    with torch.no_grad():
        expected = reference(ids).logits
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"stand-in for the weights the blocks are made from")
    model = models._apply_precision(build(), "q4k", "invariant", folder)
    assert not [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    with torch.no_grad():
        got = model(ids).logits
    # Random-init logits are nearly flat, so top-1 agreement means little here (the real draft's
    # acceptance is what the sweep measures); the size of the error does: no larger than the other
    # 4-bit precision's (w4abf16, 64 weights a group) on the same model.
    agreement = precision.compare_logits(got, expected)
    assert agreement.max_abs_over_std <= precision.BLOCK_PRECISIONS["q4k"].logit_tolerance
    w4 = models._apply_precision(build(), "w4abf16", "invariant")
    with torch.no_grad():
        w4_error = (w4(ids).logits.float() - expected).norm()
    assert (got - expected).norm() < w4_error
    assert all(d.exact for d in row_divergence.row_divergence(model, ids[0].tolist(), 4))
    caches = sorted(folder.glob("model.safetensors.q4k-*.safetensors"))
    assert len(caches) == 1

    def no_quantizing(weight):
        raise AssertionError("quantized again although the cache was valid")

    monkeypatch.setattr(kquants, "quantize_q4k", no_quantizing)
    again = models._apply_precision(build(), "q4k", "invariant", folder)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, got)
    # Read back from the cache file's mapping, the blocks still live page-aligned in one buffer.
    blocks = [m.blocks for m in again.modules() if isinstance(m, kquants.KQuantLinear)]
    assert blocks and all(b.data_ptr() % kquants.PAGE == 0 for b in blocks)
    (folder / "model.safetensors").write_bytes(b"other weights of another size")
    with pytest.raises(AssertionError, match="quantized again"):
        models._apply_precision(build(), "q4k", "invariant", folder)


def test_blocks_are_copied_page_aligned_and_compute_the_same_bits():
    """A cache file's mapping leaves tensors at any offset; the resident copy starts each on a page,
    holds the same bytes in memory of its own, and the kernels read it to the same bits."""
    g = torch.Generator().manual_seed(3)
    packed = torch.from_numpy(kquants.pack(kquants.quantize_q4k(torch.randn(40, 512, generator=g))))
    raw = torch.empty(packed.numel() + 1, dtype=torch.uint8)
    shifted = raw[1:].view(packed.shape)
    shifted.copy_(packed)
    assert shifted.data_ptr() % 64 != 0
    resident = kquants.resident_blocks({"shifted": shifted, "other": packed[:3]})
    assert all(t.data_ptr() % kquants.PAGE == 0 for t in resident.values())
    assert torch.equal(resident["shifted"], packed) and torch.equal(resident["other"], packed[:3])
    shifted.zero_()  # a copy, not a view of the source
    assert torch.equal(resident["shifted"], packed)
    shifted.copy_(packed)
    x = torch.randn(3, 512, generator=g)
    copied = kquants.KQuantLinear("Q4_K", resident["shifted"], 40, 512, None)(x)
    assert torch.equal(copied, kquants.KQuantLinear("Q4_K", shifted, 40, 512, None)(x))


def test_block_precisions_need_the_invariant_kernels():

    for name in ("gguf", "q4k"):
        with pytest.raises(kquants.UnsupportedError, match="--draft_kernels invariant"):
            load_pair("tiny-qwen2", draft_precision=name, draft_kernels="stock")


# --------------------------------------------------------------------------- a model on its file's blocks


def test_gguf_precision_needs_a_file_and_its_own_kernels():

    with pytest.raises(kquants.UnsupportedError, match="has none"):
        load_pair("tiny-qwen2", target_precision="gguf", target_kernels="invariant", with_draft=False)
    with pytest.raises(kquants.UnsupportedError, match="--target_kernels invariant"):
        load_pair("tiny-qwen2", target_precision="gguf", target_kernels="stock", with_draft=False)


@pytest.mark.real
@pytest.mark.slow
def test_real_target_runs_the_files_blocks_exactly(pairs):
    """Every linear layer holds its GGUF tensor's blocks (their values are the converted float
    weights, which were dequantized from the same file), and a 4-token verification computes
    each row exactly as a one-token step does."""
    from harness.experiments import row_divergence
    from harness.pairs import models

    pair = pairs.get(models.DEFAULT_PAIR, target_precision="gguf", with_draft=False)
    layers = {n: m for n, m in pair.target.named_modules() if isinstance(m, kquants.KQuantLinear)}
    assert len(layers) == 7 * pair.target.config.num_hidden_layers + 1
    assert {m.kind for m in layers.values()} == {"Q4_K", "Q6_K"}
    assert not any(type(m) is torch.nn.Linear for m in pair.target.modules())
    # the file's values: compare one layer of each kind with the float weights converted from it
    from harness.weights import packaged

    folder = packaged.converted_dir(packaged.get_model(pair.spec.target.packaged_key))
    float_model = models._load_hf(folder)
    floats = dict(float_model.named_modules())
    for kind in ("Q4_K", "Q6_K"):
        name, lin = next((n, m) for n, m in layers.items() if m.kind == kind and "layers.1." in n)
        blocks = kquants.read_linear_blocks(models.gguf_file(pair.spec.target, None), [name], 28)[name]
        expected = floats[name].weight.detach().numpy()
        np.testing.assert_allclose(
            kquants.dequantize(kquants.decode(kind, blocks[1])), expected, rtol=1e-6, atol=1e-7
        )
    del float_model
    ids = list(pair.tokenizer("def fibonacci(n):\n    if n < 2:\n        return n\n")["input_ids"])
    report = row_divergence.row_divergence(pair.target, ids, 4)
    assert all(d.exact for d in report), [d for d in report if not d.exact]
    # bytes a token reads: the packed blocks (about 4.6-6.6 bits per weight)
    assert sum(m.bytes_read for m in layers.values()) < 1.1e9


@pytest.mark.real
def test_draft_blocks_without_a_kernel_are_refused(pairs):
    from harness.pairs import models

    pairs.require_weights(models.DEFAULT_PAIR)
    with pytest.raises(kquants.UnsupportedError, match="Q5_0"):
        load_pair(models.DEFAULT_PAIR, draft_precision="gguf", draft_kernels="invariant")


def test_packed_blocks_cache_round_trips_and_refuses_stale_or_damaged_files(tmp_path):
    """The re-packed blocks are cached beside their source: read back equal; a cache of another
    source, other layers, a truncated or overwritten cache, or one without its marker is not used
    (the caller makes the blocks again)."""
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF" + bytes(100))
    _, lin = layer("Q4_K", 20, 2)
    _, lin6 = layer("Q6_K", 16, 1)
    packed = {"a.q_proj": ("Q4_K", lin.blocks), "a.down_proj": ("Q6_K", lin6.blocks)}
    path = kquants.packed_cache_path(gguf_file)
    assert str(kquants.LAYOUT) in path.name

    def read():
        return kquants._read_packed(path, gguf_file, list(packed))

    kquants._write_packed(path, gguf_file, packed)
    back = read()
    assert {k: (kind, t.tolist()) for k, (kind, t) in back.items()} == {
        k: (kind, t.tolist()) for k, (kind, t) in packed.items()
    }
    assert kquants._read_packed(path, gguf_file, ["a.q_proj"]) is None  # other layers
    gguf_file.write_bytes(b"GGUF" + bytes(101))
    assert read() is None  # another source
    gguf_file.write_bytes(b"GGUF" + bytes(99) + b"x")
    assert read() is None  # the same size, other content
    gguf_file.write_bytes(b"GGUF" + bytes(100))
    assert read() is not None  # rewritten with the content recorded: still the source

    kquants._write_packed(path, gguf_file, packed)
    data = bytearray(path.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])  # the last bytes flipped in place, the size kept
    path.write_bytes(bytes(data))
    assert read() is None
    kquants._write_packed(path, gguf_file, packed)
    path.write_bytes(bytes(data[: len(data) // 2]))
    assert read() is None  # truncated
    kquants._write_packed(path, gguf_file, packed)
    kquants._marker(path).unlink()
    assert read() is None  # a cache nothing vouches for
    kquants._write_packed(path, gguf_file, packed)
    assert read() is not None


def test_verify_finds_a_damaged_cache_whose_size_and_time_were_kept(tmp_path):
    """A flip written back with the file's own size and modification time passes the quick check;
    ``verify`` (the CLI's --verify, the loads that pass it on) hashes every byte and refuses it."""
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF" + bytes(100))
    _, lin = layer("Q4_K", 20, 2)
    packed = {"a.q_proj": ("Q4_K", lin.blocks)}
    path = kquants.packed_cache_path(gguf_file)
    kquants._write_packed(path, gguf_file, packed)
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert kquants._read_packed(path, gguf_file, list(packed)) is not None  # the quick check is fooled
    assert kquants._read_packed(path, gguf_file, list(packed), verify=True) is None
    made = []
    kquants._cached(path, gguf_file, list(packed), lambda: made.append(1) or packed, verify=True)
    assert made == [1]  # made again, not read


def test_a_cache_write_the_disk_refuses_costs_only_the_next_load(tmp_path):
    """A file-size limit (as a full disk) fails safetensors' write: logged, the partial file removed,
    no marker left to vouch for anything."""
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF" + bytes(100))
    _, lin = layer("Q4_K", 256, 8)
    path = kquants.packed_cache_path(gguf_file)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        kquants._write_packed(path, gguf_file, {"a.q_proj": ("Q4_K", lin.blocks)})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert not path.exists() and not kquants._marker(path).exists()
    assert not list(tmp_path.glob("*.partial-*"))


def test_a_cut_gguf_file_is_named_not_a_reshape_error(tmp_path):
    recipe = tiny.TinyRecipe(
        "llama", vocab_size=12, draft_vocab_size=12, hidden=32, layers=2, heads=2, seed=1
    )
    whole = tiny.gguf_file(tiny.build_target(recipe), tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    with pytest.raises(HarnessError, match=r"cut.gguf is not a whole GGUF file"):
        kquants.read_linear_blocks(cut, ["model.layers.0.self_attn.q_proj"], 2)
