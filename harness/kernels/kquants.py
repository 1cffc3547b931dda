"""The ``gguf`` precision: a model's linear layers run the GGUF file's own k-quant blocks.

The weights are the values stored in the file (Q4_K and Q6_K blocks, as llama.cpp users run them),
not dequantized and re-quantized to another format: a one-token step then reads ~4.6-6.6 bits per
weight. Activations are quantized per row to int8 blocks of 256 and every block's dot product is an
integer sum (``harness/kernels/kquants.cpp``), so a row's result does not depend on how many rows
are computed together: batch-invariant by construction, like the int8 x int8 kernels in
``harness.kernels.invariant``.

Loading reads the blocks with the ``gguf`` package and re-packs them once into the kernels' layout
(decoded 6-bit scales, Q6_K's high bits regrouped); the float model keeps everything else (norms,
biases, embeddings: the file's own values, dequantized once by the weights' conversion).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from harness.base import files
from harness.base.errors import HarnessError, UnsupportedError
from harness.kernels import cppext

QK = 256
# Bytes of one block as stored in the file, per type.
BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}
# Bytes of one block in the kernels' layout (what a forward reads per block).
PACKED_BYTES = {"Q4_K": 148, "Q6_K": 210}
# The kernels' record of a block, per column: (values per sub-block, bytes per sub-block, fixed bytes).
_RECORD = {"Q4_K": (32, 18, 4), "Q6_K": (16, 13, 2)}
_SOURCE = Path(__file__).with_name("kquants.cpp")
log = logging.getLogger(__name__)


@functools.cache
def extension():
    """The compiled k-quant kernels (built once, ~1 min; then loaded from the cache)."""
    return cppext.build("assisted_generation_kquants", _SOURCE)


# --------------------------------------------------------------------------- decoding the file's blocks


@dataclass(frozen=True)
class Q4KCodes:
    """Q4_K blocks decoded: value[n, k] = d * scale * code - dmin * min, per 32-code sub-block."""

    codes: np.ndarray  # uint8 [N, K], 0..15
    scales: np.ndarray  # uint8 [N, K/32], 0..63
    mins: np.ndarray  # uint8 [N, K/32], 0..63
    d: np.ndarray  # float32 [N, K/256]
    dmin: np.ndarray  # float32 [N, K/256]


@dataclass(frozen=True)
class Q6KCodes:
    """Q6_K blocks decoded: value[n, k] = d * scale * (code - 32), per 16-code sub-block."""

    codes: np.ndarray  # uint8 [N, K], 0..63
    scales: np.ndarray  # int8 [N, K/16]
    d: np.ndarray  # float32 [N, K/256]


def _blocks(raw: np.ndarray, kind: str) -> np.ndarray:
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] % BLOCK_BYTES[kind]:
        raise HarnessError(f"{kind} data must be [rows, blocks * {BLOCK_BYTES[kind]}] bytes, got {raw.shape}")
    return raw.reshape(raw.shape[0], -1, BLOCK_BYTES[kind])


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def decode_q4k(raw: np.ndarray) -> Q4KCodes:
    """[N, nb * 144] file bytes -> codes, scales, mins, d, dmin (ggml's block_q4_K)."""
    b = _blocks(raw, "Q4_K")
    n, nb = b.shape[:2]
    s = b[..., 4:16]
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    # 6-bit scales and mins packed into 12 bytes (ggml's get_scale_min_k4)
    scales = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    qs = b[..., 16:].reshape(n, nb, 4, 1, 32)
    codes = (qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F
    return Q4KCodes(
        codes=codes.reshape(n, nb * QK),
        scales=scales.reshape(n, nb * 8),
        mins=mins.reshape(n, nb * 8),
        d=_f16(b[..., 0:2]),
        dmin=_f16(b[..., 2:4]),
    )


def decode_q6k(raw: np.ndarray) -> Q6KCodes:
    """[N, nb * 210] file bytes -> codes (0..63 for q + 32), int8 scales, d (ggml's block_q6_K)."""
    b = _blocks(raw, "Q6_K")
    n, nb = b.shape[:2]
    ql = b[..., 0:128].reshape(n, nb, 2, 1, 64)
    qh = b[..., 128:192].reshape(n, nb, 2, 1, 32)
    lo = (ql >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F  # [n, nb, 2, 2, 64]
    hi = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 0x03  # [n, nb, 2, 4, 32]
    # Within each half of 128: code l and l+32 take the low nibbles of ql[l], ql[l+32]; l+64 and
    # l+96 their high nibbles; qh[l] holds the top two bits of all four.
    codes = lo.reshape(n, nb, 2, 4, 32) | (hi << 4)
    return Q6KCodes(
        codes=codes.reshape(n, nb * QK),
        scales=b[..., 192:208].view(np.int8).reshape(n, nb * 16),
        d=_f16(b[..., 208:210]),
    )


def decode(kind: str, raw: np.ndarray) -> Q4KCodes | Q6KCodes:
    """One tensor's file bytes decoded by its block type."""
    if kind == "Q4_K":
        return decode_q4k(raw)
    if kind == "Q6_K":
        return decode_q6k(raw)
    raise UnsupportedError(f"no k-quant kernel for GGUF block type {kind}; supported: Q4_K, Q6_K")


def dequantize(codes: Q4KCodes | Q6KCodes) -> np.ndarray:
    """The float32 weights the codes stand for (the reference the kernels are tested against)."""
    n, k = codes.codes.shape
    c = codes.codes.astype(np.float32)
    d = np.repeat(codes.d, QK, axis=1)
    if isinstance(codes, Q4KCodes):
        sc = np.repeat(codes.scales.astype(np.float32), 32, axis=1)
        mn = np.repeat(codes.mins.astype(np.float32), 32, axis=1)
        dmin = np.repeat(codes.dmin, QK, axis=1)
        return d * sc * c - dmin * mn
    sc = np.repeat(codes.scales.astype(np.float32), 16, axis=1)
    return d * sc * (c - 32.0)


# --------------------------------------------------------------------------- float weights to Q4_K

# Candidate inverse scales per 32-weight sub-block, as offsets to the 15 levels (llama.cpp's
# make_qkx2_quants searches -1 .. +1 in steps of 0.1; five points keep a 0.5B model's quantization
# to seconds and reached the same error within 1-2% on its weights).
_Q4K_SEARCH = (-1.0, -0.5, 0.0, 0.5, 1.0)
_Q4K_CHUNK_ROWS = 256


def _fit_sub_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 32-weight sub-block (last dim) the scale s >= 0 and offset m <= 0 that best fit
    ``x ~ s * code + m`` with codes 0..15 (least squares over a few candidate grids)."""
    lo = x.amin(-1, keepdim=True).clamp(max=0.0)
    span = x.amax(-1, keepdim=True) - lo
    safe = torch.where(span > 0, span, torch.ones_like(span))
    best_s, best_m = span / 15.0, lo  # the plain min/max grid, then the least-squares fits below
    best_err = ((best_s * ((x - lo) * (15.0 / safe)).round().clamp(0, 15) + lo - x) ** 2).sum(-1)
    n = x.shape[-1]
    for offset in _Q4K_SEARCH:
        codes = ((x - lo) * ((15.0 + offset) / safe)).round().clamp(0, 15)
        sl, sl2 = codes.sum(-1, keepdim=True), (codes * codes).sum(-1, keepdim=True)
        sx, sxl = x.sum(-1, keepdim=True), (x * codes).sum(-1, keepdim=True)
        det = n * sl2 - sl * sl
        ok = det > 0
        det = torch.where(ok, det, torch.ones_like(det))
        s = torch.where(ok, (n * sxl - sl * sx) / det, best_s)
        m = torch.where(ok, (sl2 * sx - sl * sxl) / det, best_m)
        # An offset above zero is not representable (Q4_K subtracts a non-negative min): refit s alone.
        pos = m > 0
        s = torch.where(pos, sxl / sl2.clamp_min(1.0), s).clamp_min(0.0)
        m = m.clamp(max=0.0)
        err = ((s * codes + m - x) ** 2).sum(-1)
        better = (err < best_err).unsqueeze(-1)
        best_s, best_m = torch.where(better, s, best_s), torch.where(better, m, best_m)
        best_err = torch.minimum(err, best_err)
    return best_s.squeeze(-1), best_m.squeeze(-1)


def _super_scale(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight non-negative sub-block values -> (float16-exact super-block scale, 6-bit codes)."""
    d = (v.amax(-1) / 63.0).half().float()
    safe = torch.where(d > 0, d, torch.ones_like(d))
    codes = (v / safe.unsqueeze(-1)).round().clamp(0, 63) * (d > 0).unsqueeze(-1)
    return d, codes


def quantize_q4k(weight: torch.Tensor) -> Q4KCodes:
    """Float weights [N, K] as Q4_K blocks; K is padded with zeros to a multiple of 256.

    Written here because the ``gguf`` package (0.19) quantizes to Q8_0/Q5_0 and the like but not to
    the k-quants. Used for a draft, whose weights only make proposals (the target verifies every
    token), so its quantization changes speed and acceptance, never the output."""
    w = weight.detach().float()
    n, k = w.shape
    kp = -(-k // QK) * QK
    w = torch.nn.functional.pad(w, (0, kp - k))
    nb = kp // QK
    parts: dict[str, list[np.ndarray]] = {"codes": [], "scales": [], "mins": [], "d": [], "dmin": []}
    for r0 in range(0, n, _Q4K_CHUNK_ROWS):
        x = w[r0 : r0 + _Q4K_CHUNK_ROWS].reshape(-1, nb, 8, 32)
        s, m = _fit_sub_blocks(x)
        d, sc = _super_scale(s)
        dmin, mn = _super_scale(-m)
        step = (d.unsqueeze(-1) * sc).unsqueeze(-1)
        shift = (dmin.unsqueeze(-1) * mn).unsqueeze(-1)
        codes = ((x + shift) / torch.where(step > 0, step, torch.ones_like(step))).round().clamp(0, 15)
        codes = codes * (step > 0)
        parts["codes"].append(codes.to(torch.uint8).reshape(-1, kp).numpy())
        parts["scales"].append(sc.to(torch.uint8).reshape(-1, nb * 8).numpy())
        parts["mins"].append(mn.to(torch.uint8).reshape(-1, nb * 8).numpy())
        parts["d"].append(d.numpy())
        parts["dmin"].append(dmin.numpy())
    return Q4KCodes(**{name: np.concatenate(chunks) for name, chunks in parts.items()})


# --------------------------------------------------------------------------- the kernels' layout

COLUMNS = 16  # output columns per group: one 32-bit lane each in the kernels' vectors


def _f16_bytes(a: np.ndarray) -> np.ndarray:
    """Block scales as float16, the file's own format: every d and dmin is a float16 value (read from
    the file, or rounded to one by ``quantize_q4k``), so the kernels widen them back exactly."""
    half = a.astype(np.float16)
    if not np.array_equal(half.astype(np.float32), a, equal_nan=True):
        raise HarnessError("block scales must be float16 values")
    return np.ascontiguousarray(half).view(np.uint8)


def record_subs(kind: str, values: int = QK) -> int:
    """Sub-blocks the record of a block holding ``values`` real inputs keeps: all of them, except in
    a row's last block, which stops after the pair of sub-blocks that holds its last input.

    Why: a 0.5B draft's 896-wide rows fill 3.5 of their 4 blocks; the zero padding multiplies zero
    activations (adds nothing to any integer sum), yet reading it was ~9% of the draft's bytes, and
    a one-token step is paced by its bytes. Whole pairs, because scales and mins are stored by pair."""
    width = _RECORD[kind][0]
    return 2 * -(-values // (2 * width))


def row_bytes(kind: str, in_features: int) -> int:
    """Bytes of one group of 16 output columns in the kernels' layout: every block's record, the
    last one short when ``in_features`` is not a multiple of 256."""
    _, per_sub, fixed = _RECORD[kind]
    nb = -(-in_features // QK)
    last = in_features - (nb - 1) * QK
    return COLUMNS * ((nb - 1) * PACKED_BYTES[kind] + per_sub * record_subs(kind, last) + fixed)


def pack(codes: Q4KCodes | Q6KCodes, width: int | None = None) -> np.ndarray:
    """Blocks in the kernels' layout: [groups of 16 columns, ``row_bytes``] (see kquants.cpp).

    Per group and block: the scales (and Q4_K's mins) as [pair][column][2]; d (and dmin) as 16
    float16; then the codes by steps of 4 inputs, 16 columns x 4 codes per step (Q4_K two steps
    per 64 bytes, in the low and high nibbles; Q6_K per 4 steps two such nibble vectors and one of
    their top two bits). The head comes first so that a kernel reads a record front to back.
    Columns are padded to 16 with zeros. ``width``: the real inputs of a row whose codes were padded
    to whole blocks (the last record keeps only ``record_subs`` sub-blocks).
    """
    n, k = codes.codes.shape
    nb, groups = k // QK, -(-n // COLUMNS)
    width = k if width is None else width
    if not (nb - 1) * QK < width <= k:
        raise HarnessError(f"a width of {width} does not end in the last of {nb} blocks")
    pad = groups * COLUMNS - n

    def grouped(a: np.ndarray) -> np.ndarray:  # [N, nb, ...] -> [G, nb, 16, ...]
        a = np.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
        a = a.reshape(groups, COLUMNS, *a.shape[1:])
        return np.moveaxis(a, 1, 2)

    c = grouped(codes.codes.reshape(n, nb, QK // 4, 4))  # [G, nb, 16, steps, 4]
    c = np.moveaxis(c, 2, 3)  # [G, nb, steps, 16, 4]

    def pairs(a: np.ndarray, subs: int) -> np.ndarray:  # [N, nb*subs] -> [G, nb, subs/2, 16, 2]
        a = grouped(a.reshape(n, nb, subs // 2, 2))  # [G, nb, 16, subs/2, 2]
        return np.moveaxis(a, 2, 3).reshape(groups, nb, -1).view(np.uint8)

    def floats(a: np.ndarray) -> np.ndarray:
        return _f16_bytes(grouped(a.reshape(n, nb))).reshape(groups, nb, -1)

    # Each part of a record, and whether it is laid out sub-block after sub-block (cut in a short
    # record) or fixed.
    if isinstance(codes, Q4KCodes):
        kind = "Q4_K"
        steps = c.reshape(groups, nb, QK // 8, 2, COLUMNS * 4)
        nibbles = (steps[:, :, :, 0] | (steps[:, :, :, 1] << 4)).reshape(groups, nb, -1)
        parts = [(pairs(codes.scales, 8), True), (pairs(codes.mins, 8), True)]
        parts += [(floats(codes.d), False), (floats(codes.dmin), False), (nibbles, True)]
    else:
        kind = "Q6_K"
        c = c.reshape(groups, nb, QK // 16, 4, COLUMNS * 4)  # [G, nb, sub-block, step, 64]
        lo, hi = c & 0x0F, c >> 4
        six = np.concatenate(
            [
                lo[:, :, :, 0] | (lo[:, :, :, 1] << 4),
                lo[:, :, :, 2] | (lo[:, :, :, 3] << 4),
                hi[:, :, :, 0] | (hi[:, :, :, 1] << 2) | (hi[:, :, :, 2] << 4) | (hi[:, :, :, 3] << 6),
            ],
            axis=3,
        )
        parts = [(pairs(codes.scales, 16), True), (floats(codes.d), False)]
        parts += [(six.reshape(groups, nb, -1), True)]
    parts = [(p.astype(np.uint8, copy=False), cut) for p, cut in parts]
    whole = np.concatenate([p[:, : nb - 1] for p, _ in parts], axis=2).reshape(groups, -1)
    keep = record_subs(kind, width - (nb - 1) * QK) / (QK // _RECORD[kind][0])
    last = [p[:, nb - 1, : int(p.shape[2] * keep)] if cut else p[:, nb - 1] for p, cut in parts]
    return np.concatenate([whole, *last], axis=1)


class KQuantLinear(nn.Module):
    """nn.Linear replacement holding a GGUF tensor's k-quant blocks (as ``pack`` lays them out);
    float32 in, float32 out."""

    def __init__(
        self, kind: str, blocks: torch.Tensor, out_features: int, in_features: int, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        if kind not in PACKED_BYTES:
            raise UnsupportedError(f"no k-quant kernel for GGUF block type {kind}; supported: Q4_K, Q6_K")
        # An input width that is not a multiple of 256 (a 0.5B draft's 896) runs as if zero-padded,
        # its last block's record short (``record_subs``).
        groups = -(-out_features // COLUMNS)
        if tuple(blocks.shape) != (groups, row_bytes(kind, in_features)):
            raise HarnessError(
                f"{kind} blocks of shape {tuple(blocks.shape)} do not hold a "
                f"{out_features} x {in_features} weight"
            )
        self.kind, self.in_features, self.out_features = kind, in_features, out_features
        self.register_buffer("blocks", blocks.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_raw(cls, kind: str, raw: np.ndarray, bias: torch.Tensor | None = None) -> KQuantLinear:
        """From the file's bytes of one tensor, [rows, blocks x block bytes]."""
        codes = decode(kind, raw)
        n, k = codes.codes.shape
        return cls(kind, torch.from_numpy(pack(codes)), n, k, bias)

    @property
    def bytes_read(self) -> int:
        """Bytes one forward streams from the weights (every block once, whatever M)."""
        return self.blocks.numel()

    def forward(
        self, x: torch.Tensor, force_avx2: bool = False, one_row_near: bool | None = None
    ) -> torch.Tensor:
        # one_row_near: a one-row pass's prefetch variant, None for the one this host kind runs
        # (kquants.cpp, `one_row_near`); either gives the same bits, which the tests hold.
        lead, dtype = x.shape[:-1], x.dtype
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        run = extension().linear_q4k if self.kind == "Q4_K" else extension().linear_q6k
        near = -1 if one_row_near is None else int(one_row_near)
        y = run(x2, self.blocks, self.out_features, force_avx2, near)
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, blocks={self.kind}"


# --------------------------------------------------------------------------- a model on its file's blocks


def _arch(reader) -> str:
    field = reader.fields.get("general.architecture")
    if field is None:
        raise HarnessError("the GGUF file names no general.architecture; it cannot be matched to a model")
    return str(field.contents())


def read_linear_blocks(gguf_file: str | Path, module_names: list[str], n_layers: int) -> dict[str, tuple]:
    """``{module name: (block type, raw bytes [N, nb * block bytes])}`` for the model's linear layers,
    matched to the file's tensors by gguf's own name map (``blk.0.attn_q`` for
    ``model.layers.0.self_attn.q_proj``, ``output`` for ``lm_head``)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(gguf_file))
    except (ValueError, OSError) as exc:  # a cut or overwritten file: its tensors do not fit the bytes
        raise HarnessError(
            f"{gguf_file} is not a whole GGUF file ({exc}); copy it again, or delete it to have a packaged "
            "model's assembled again from its installed parts"
        ) from None
    arch_name = _arch(reader)
    arch = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name), None)
    if arch is None:
        raise UnsupportedError(f"{gguf_file}: architecture {arch_name!r} is unknown to the gguf package")
    names = gguf.get_tensor_name_map(arch, n_layers)
    tensors = {t.name: t for t in reader.tensors}
    out, missing = {}, []
    for module in module_names:
        gname = names.get_name(module)
        tensor = tensors.get(f"{gname}.weight") if gname else None
        if tensor is None:
            missing.append(module)
        else:
            out[module] = (tensor.tensor_type.name, np.asarray(tensor.data))
    unsupported = sorted({kind for kind, _ in out.values()} - set(BLOCK_BYTES))
    if unsupported:
        raise UnsupportedError(
            f"{Path(gguf_file).name} stores linear weights as {', '.join(unsupported)}; the gguf "
            f"precision runs {', '.join(BLOCK_BYTES)} only (use precision w8af32 for this model)"
        )
    if missing:
        raise UnsupportedError(
            f"{gguf_file} has no tensor for {', '.join(missing[:3])}; the gguf precision needs the file the "
            "model was converted from (and a model whose layers are its own: no draft vocabulary cut)"
        )
    return out


# Bumped whenever pack() or quantize_q4k() changes, so a cache of another layout is rebuilt rather
# than misread.
LAYOUT = 7

Packed = dict[str, tuple[str, torch.Tensor]]  # module name -> (block type, blocks in pack()'s layout)


def packed_cache_path(source: str | Path, tag: str = "kquants") -> Path:
    """Where blocks made from ``source`` (a GGUF file, or a weights file) are cached: beside it,
    named by layout version and ``tag``."""
    source = Path(source)
    return source.with_name(f"{source.name}.{tag}-v{LAYOUT}.safetensors")


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _read_packed(path: Path, source: Path, names: list[str], *, verify: bool = False) -> Packed | None:
    """The cached blocks, or None when absent, made from another source or layout, or damaged.

    A marker beside the cache records size, time and checksum of the source and of the cache itself
    (``files.record``): a source replaced, or a cache truncated or overwritten in place, is seen and
    the blocks are made again rather than multiplied."""
    from safetensors import SafetensorError, safe_open

    try:
        marker = json.loads(_marker(path).read_text())
        recorded = marker["files"]
        if marker.get("layout") != LAYOUT or set(recorded) != {source.name, path.name}:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    why = files.problem(path.parent, recorded, verify=verify)
    if why is not None:
        log.warning("re-packed blocks at %s are not usable (%s); making them again", path, why)
        return None
    try:
        with safe_open(str(path), framework="pt") as fh:
            kinds = json.loads((fh.metadata() or {}).get("kinds", "{}"))
            if sorted(kinds) != sorted(names):
                return None
            return {name: (kinds[name], fh.get_tensor(name)) for name in names}
    except (SafetensorError, OSError, ValueError, KeyError) as exc:
        log.warning("re-packed blocks at %s are unreadable (%s); making them again", path, exc)
        return None


def _write_packed(path: Path, source: Path, packed: Packed) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    meta = {"layout": str(LAYOUT), "source": source.name}
    meta["kinds"] = json.dumps({name: kind for name, (kind, _) in packed.items()})
    tmp = path.with_name(path.name + f".partial-{os.getpid()}")
    try:
        _marker(path).unlink(missing_ok=True)  # no marker ever vouches for a cache being replaced
        save_file({name: t for name, (_, t) in packed.items()}, str(tmp), metadata=meta)
        os.replace(tmp, path)  # whole or not at all: a reader never sees half a file
        path.chmod(0o644)  # the cache may be shared, as the converted weights are
        marker = {"layout": LAYOUT, "files": files.record(path.parent, [source.name, path.name])}
        files.atomic_write(_marker(path), json.dumps(marker, indent=1).encode())
    except (OSError, SafetensorError) as exc:
        # A read-only cache, a full disk or a file-size limit only costs the next load its re-packing.
        log.warning("could not cache re-packed blocks at %s (%s)", path, exc)
        tmp.unlink(missing_ok=True)


def _cached(
    cache: Path | None, source: Path | None, names: list[str], make, *, verify: bool = False
) -> Packed:
    if cache is None or source is None:
        return make()
    packed = _read_packed(cache, source, names, verify=verify)
    if packed is None:
        packed = make()
        _write_packed(cache, source, packed)
    return packed


def _gguf_blocks(model: nn.Module, linears: dict[str, nn.Linear], gguf_file: Path) -> Packed:
    n_layers = int(getattr(model.config, "num_hidden_layers", 0))
    packed = {}
    for name, (kind, data) in read_linear_blocks(gguf_file, list(linears), n_layers).items():
        codes = decode(kind, data)
        n, k = codes.codes.shape
        if (n, k) != tuple(linears[name].weight.shape):
            raise HarnessError(
                f"{name}: the file's tensor is {n} x {k}, the model's "
                f"{tuple(linears[name].weight.shape)}; the converted weights do not come from "
                f"{gguf_file.name}"
            )
        packed[name] = (kind, torch.from_numpy(pack(codes)))
    return packed


def _q4k_blocks(linears: dict[str, nn.Linear]) -> Packed:
    return {
        name: ("Q4_K", torch.from_numpy(pack(quantize_q4k(lin.weight), lin.in_features)))
        for name, lin in linears.items()
    }


def _q4k_cache(linears: dict[str, nn.Linear], weights: Path | None) -> tuple[Path | None, Path | None]:
    """The weights file q4k blocks are made from, and their cache: named by the layers' shapes too,
    since a draft's vocabulary cut changes its output layer."""
    source = weights / "model.safetensors" if weights is not None else None
    if source is None or not source.is_file():
        return None, None
    shapes = json.dumps(sorted((name, tuple(lin.weight.shape)) for name, lin in linears.items()))
    digest = hashlib.sha256(shapes.encode()).hexdigest()[:12]
    return source, packed_cache_path(source, f"q4k-{digest}")


# Where each tensor of ``resident_blocks``' buffer starts: a page. A Q4_K record is 37 cache lines
# long, so each of its 64-byte loads is one line; a Q6_K record is 52.5, so every other one starts
# half a line in (not padded: records padded with unread bytes ran slower, docs/FINDINGS.md).
PAGE = 4096


def resident_blocks(blocks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same blocks, copied into one page-aligned buffer of the process's own memory.

    Why: read from the cache file's mapping, the tensors started wherever safetensors' header left
    them (not on a 64-byte line: each zmm load of a record spanned two cache lines) and on the page
    cache's 4 KB pages. numpy backs a large allocation with transparent huge pages where Linux
    offers them (it asks with madvise), so the kernels' weight stream walks 2 MB pages. On AMD EPYC
    family 25 model 17 (Zen 4) the k-quant products over the whole target ran 0.84x the time of the
    mapped blocks (interleaved, one process; the same bytes, so the same bits). The cost: the blocks
    count as the process's memory, not as page cache (about 1 GB for the 1.5B target)."""
    sizes = {name: t.numel() * t.element_size() for name, t in blocks.items()}
    starts, total = {}, 0
    for name, size in sizes.items():
        starts[name] = total
        total += -(-size // PAGE) * PAGE
    raw = np.empty(total + PAGE, dtype=np.uint8)
    skip = -raw.ctypes.data % PAGE
    buffer = torch.from_numpy(raw[skip : skip + total])
    out = {}
    for name, t in blocks.items():
        view = buffer[starts[name] : starts[name] + sizes[name]].view(t.dtype).view(t.shape)
        view.copy_(t)
        out[name] = view
    return out


def apply_blocks(
    model: nn.Module, name: str, source: str | Path | None, *, verify: bool = False
) -> nn.Module:
    """Replace every nn.Linear of ``model`` (float32) by a ``KQuantLinear`` and switch attention to
    the batch-invariant attention; in place.

    ``gguf``: the blocks of each tensor in ``source``, the GGUF file the model was converted from.
    ``q4k``: the model's own float weights quantized to Q4_K; ``source`` is its weights folder, where
    the blocks are cached (None: made in memory on every load). Either way the re-packed blocks are
    cached beside their source, so a second load reads them instead of making them again (``verify``:
    the cache's every byte checked against its record first, not only its size and time)."""
    from harness.kernels import invariant
    from harness.settings import precision

    linears = {mod_name: mod for mod_name, mod in model.named_modules() if type(mod) is nn.Linear}
    if not linears:
        raise UnsupportedError(f"{type(model).__name__} has no linear layers to run on k-quant blocks")
    if name == "gguf":
        if source is None:
            raise UnsupportedError(
                f"precision {name} runs a model's GGUF file and this model has none; choose one of "
                f"{', '.join(precision.PRECISIONS)} or q4k"
            )
        gguf_file = Path(source)
        cache = packed_cache_path(gguf_file)
        make = lambda: _gguf_blocks(model, linears, gguf_file)  # noqa: E731
        packed = _cached(cache, gguf_file, list(linears), make, verify=verify)
    elif name == "q4k":
        weights, cache = _q4k_cache(linears, Path(source) if source is not None else None)
        packed = _cached(cache, weights, list(linears), lambda: _q4k_blocks(linears), verify=verify)
    else:
        raise UnsupportedError(f"no k-quant blocks for precision {name}; the block precisions: gguf, q4k")
    precision.untie_output_embeddings(model)
    extension()
    resident = resident_blocks({mod_name: blocks for mod_name, (_, blocks) in packed.items()})
    for mod_name, lin in linears.items():
        kind, blocks = packed[mod_name][0], resident[mod_name]
        twin = KQuantLinear(kind, blocks, lin.out_features, lin.in_features, lin.bias)
        parent_name, _, child = mod_name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, twin)
    invariant.use_invariant_attention(model)
    return model
