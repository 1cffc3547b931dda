"""The ``gguf`` precision's k-quant kernels: exact against a reference, batch-invariant, both ISAs."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import kquants

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
@pytest.mark.parametrize("force_avx2", [False, True])
def test_kernel_equals_reference_bit_for_bit(kind, force_avx2):
    raw, lin = layer(kind, 37, 3)
    x = torch.randn(5, 3 * kquants.QK, generator=torch.Generator().manual_seed(1)) * 3
    y = lin(x, force_avx2=force_avx2)
    assert np.array_equal(y.numpy(), reference(kind, raw, x))
    # and close to the float product (the activation's int8 rounding is the only difference)
    w = torch.from_numpy(kquants.dequantize(kquants.decode(kind, raw)))
    exact = x @ w.T
    assert float((y - exact).abs().max()) <= 0.02 * float(exact.abs().max())


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    m=st.integers(1, 17),
    n=st.integers(1, 40),
    nb=st.integers(1, 4),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_rows_do_not_depend_on_batch_threads_or_isa(kind, m, n, nb, threads, seed):
    _, lin = layer(kind, n, nb, seed)
    x = torch.randn(m, nb * kquants.QK, generator=torch.Generator().manual_seed(seed))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        batched = lin(x)
        one_by_one = torch.cat([lin(x[i : i + 1]) for i in range(m)])
        avx2 = lin(x, force_avx2=True)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(batched, one_by_one)
    assert torch.equal(batched, avx2)


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
    than the file: decoded scales and float32 d)."""
    n, nb = 32, 3
    _, lin = layer(kind, n, nb)
    assert lin.bytes_read == n * nb * kquants.PACKED_BYTES[kind]
    # the file's 4 or 6 bits per weight, plus decoded scales and float32 d
    assert lin.bytes_read <= 1.06 * n * nb * kquants.BLOCK_BYTES[kind]


def test_wrong_shapes_are_refused():
    _, lin = layer("Q4_K", 4, 2)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        kquants.extension().linear_q4k(torch.zeros(1, 300), lin.blocks, 4, False)
    with pytest.raises(RuntimeError, match="blocks must be"):
        kquants.extension().linear_q4k(torch.zeros(1, 768), lin.blocks, 4, False)
    with pytest.raises(kquants.HarnessError, match="Q4_K data must be"):
        kquants.decode_q4k(np.zeros((2, 100), dtype=np.uint8))
    with pytest.raises(kquants.UnsupportedError, match="Q5_0"):
        kquants.KQuantLinear.from_raw("Q5_0", np.zeros((2, 22), dtype=np.uint8))


# --------------------------------------------------------------------------- a model on its file's blocks


def test_gguf_precision_needs_a_file_and_its_own_kernels():
    from harness import models

    with pytest.raises(kquants.UnsupportedError, match="has none"):
        models.load_pair("tiny-qwen2", target_precision="gguf", target_kernels="invariant", with_draft=False)
    with pytest.raises(kquants.UnsupportedError, match="--target_kernels invariant"):
        models.load_pair("tiny-qwen2", target_precision="gguf", target_kernels="stock", with_draft=False)


@pytest.mark.real
@pytest.mark.slow
def test_real_target_runs_the_files_blocks_exactly(pairs):
    """Every linear layer holds its GGUF tensor's blocks (their values are the converted float
    weights, which were dequantized from the same file), and a 4-token verification computes
    each row exactly as a one-token step does."""
    from harness import models, row_divergence

    pair = pairs.get(models.DEFAULT_PAIR, target_precision="gguf", with_draft=False)
    layers = {n: m for n, m in pair.target.named_modules() if isinstance(m, kquants.KQuantLinear)}
    assert len(layers) == 7 * pair.target.config.num_hidden_layers + 1
    assert {m.kind for m in layers.values()} == {"Q4_K", "Q6_K"}
    assert not any(type(m) is torch.nn.Linear for m in pair.target.modules())
    # the file's values: compare one layer of each kind with the float weights converted from it
    from harness import packaged

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
    from harness import models

    pairs.require_weights(models.DEFAULT_PAIR)
    with pytest.raises(kquants.UnsupportedError, match="Q5_0"):
        models.load_pair(models.DEFAULT_PAIR, draft_precision="gguf", draft_kernels="invariant")


def test_packed_blocks_cache_round_trips_and_refuses_stale_or_damaged_files(tmp_path):
    """The re-packed blocks are cached beside the GGUF: read back equal; a cache of another source
    size, another layout, other layers, or a truncated file is not used (the caller re-packs)."""
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF" + bytes(100))
    _, lin = layer("Q4_K", 20, 2)
    _, lin6 = layer("Q6_K", 16, 1)
    packed = {"a.q_proj": ("Q4_K", lin.blocks), "a.down_proj": ("Q6_K", lin6.blocks)}
    path = kquants.packed_cache_path(gguf_file)
    kquants._write_packed(path, gguf_file, packed)
    back = kquants._read_packed(path, gguf_file, list(packed))
    assert {k: (kind, t.tolist()) for k, (kind, t) in back.items()} == {
        k: (kind, t.tolist()) for k, (kind, t) in packed.items()
    }
    assert kquants._read_packed(path, gguf_file, ["a.q_proj"]) is None  # other layers
    gguf_file.write_bytes(b"GGUF" + bytes(101))
    assert kquants._read_packed(path, gguf_file, list(packed)) is None  # another source
    gguf_file.write_bytes(b"GGUF" + bytes(100))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert kquants._read_packed(path, gguf_file, list(packed)) is None  # truncated
    assert str(kquants.LAYOUT) in path.name
