"""The ONNX Runtime target: the export computes what the torch model computes, the adapter's cache
behaves as transformers' assisted decoding needs (grow, crop, continue), and the export cache is
built once, atomically, and rebuilt when damaged."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from harness.base.backends import OrtSettings
from harness.base.errors import HarnessError, UnsupportedError
from harness.pairs import models
from harness.weights import onnx_export, onnx_model, tiny

FP32 = OrtSettings("fp32")


def _long_rope_qwen2() -> Qwen2ForCausalLM:
    """A small Qwen2 with Qwen2.5's RoPE base (1e6, not the 10000 default): an export that loses
    the base agrees on the first positions and drifts after, which only a long prompt shows."""
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = Qwen2ForCausalLM(config)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
    return model.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(torch model, adapter) for a long-RoPE tiny Qwen2 exported at fp32 into a private cache."""
    model = _long_rope_qwen2()
    root = tmp_path_factory.mktemp("onnx")
    source = tiny.saved_folder("rope-qwen2", model, tiny.build_tokenizer(), root / "hf")
    folder = onnx_export.export("rope-qwen2", source, FP32, cache=root / "cache")
    return model, onnx_model.load(folder, source, FP32, threads=1), source, root


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def test_export_matches_torch_over_a_long_prompt(exported):
    model, ort_model, _, _ = exported
    ids = _ids(300)
    with torch.inference_mode():
        want = model(ids).logits
        got = ort_model(ids).logits
    assert got.shape == want.shape  # logits for every position: verification needs all K+1
    assert torch.allclose(got, want, atol=2e-4), float((got - want).abs().max())


def test_cache_grows_crops_and_continues_like_one_forward(exported):
    """What assisted decoding does: verify K+1 tokens, crop the rejected ones, go on from there."""
    _, ort_model, _, _ = exported
    ids = _ids(40, seed=1)
    with torch.inference_mode():
        full = ort_model(ids).logits[0]
        cache = DynamicCache()
        ort_model(ids[:, :30], past_key_values=cache)
        verify = ort_model(ids[:, 30:35], past_key_values=cache).logits[0]
        assert cache.get_seq_length() == 35
        cache.crop(-3)  # two of five candidates accepted: the last three go (as generate crops)
        rest = ort_model(ids[:, 32:], past_key_values=cache).logits[0]
    assert torch.allclose(verify, full[30:35], atol=1e-4)
    assert torch.allclose(rest, full[32:], atol=1e-4)
    assert cache.get_seq_length() == 40


def test_self_draft_copy_shares_the_session(exported):
    _, ort_model, _, _ = exported
    twin = copy.deepcopy(ort_model)
    assert twin is not ort_model and twin.session is ort_model.session


def test_export_is_cached_and_checksummed(exported, monkeypatch):
    _, ort_model, source, root = exported
    folder = ort_model.folder
    record = json.loads((folder / onnx_export.MARKER).read_text())
    assert record["settings"]["label"] == "ort-fp32" and record["builder"].startswith("onnxruntime-genai")
    # Every file the export holds is recorded, the engine's config and tokenizer files too.
    present = {p.name for p in folder.iterdir() if p.name != onnx_export.MARKER}
    assert {"model.onnx", "model.onnx.data", "genai_config.json"} <= set(record["files"]) == present
    assert onnx_export.is_exported(folder, verify=True)

    def no_builder(*a, **k):
        raise AssertionError("the builder ran again for a cached export")

    monkeypatch.setattr(subprocess, "run", no_builder)
    assert onnx_export.export("rope-qwen2", source, FP32, cache=root / "cache") == folder


def test_damaged_export_is_detected(exported, tmp_path):
    _, ort_model, _, _ = exported
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    for f in ort_model.folder.iterdir():
        (copy_dir / f.name).write_bytes(f.read_bytes())
    assert onnx_export.is_exported(copy_dir, verify=True)
    data = copy_dir / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, other bytes: the checksum sees it
    data.write_bytes(bytes(raw))
    assert not onnx_export.is_exported(copy_dir, verify=True)
    data.write_bytes(bytes(raw[:-4]))
    assert not onnx_export.is_exported(copy_dir)


def test_a_failed_export_says_why_and_leaves_nothing(exported, tmp_path, monkeypatch):
    _, _, source, _ = exported

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 3, "", "ValueError: unsupported architecture")

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(HarnessError, match="(?s)exit 3.*unsupported architecture"):
        onnx_export.export("rope-qwen2", source, OrtSettings(), cache=tmp_path)
    final = onnx_export.export_dir("rope-qwen2", source, OrtSettings(), cache=tmp_path)
    assert not final.exists() and [p.name for p in final.parent.iterdir()] == [".lock"]


def test_an_interrupted_export_leaves_nothing_that_looks_finished(exported, tmp_path, monkeypatch):
    _, _, source, _ = exported

    def interrupted(cmd, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        onnx_export.export("rope-qwen2", source, OrtSettings(), cache=tmp_path)
    final = onnx_export.export_dir("rope-qwen2", source, OrtSettings(), cache=tmp_path)
    assert not final.exists() and [p.name for p in final.parent.iterdir()] == [".lock"]


def test_source_fingerprint_follows_the_weights(exported, tmp_path):
    model, _, source, _ = exported
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.lm_head.weight[0, 0] += 1.0
    changed = tiny.saved_folder("rope-qwen2", other, tiny.build_tokenizer(), tmp_path)
    assert onnx_export.source_fingerprint(changed) != onnx_export.source_fingerprint(source)
    same = tiny.saved_folder("rope-qwen2", model, tiny.build_tokenizer(), tmp_path)
    assert onnx_export.source_fingerprint(same) == onnx_export.source_fingerprint(source)


def test_a_cache_beside_the_weights_leaves_the_export_where_it_is(exported, tmp_path):
    """The k-quant blocks the kernels make from a folder's weights are cached in that folder: the
    folder's export (and a speculative folder built on it) stays the one made before they were."""
    from harness.kernels import kquants

    model, _, exported_from, _ = exported
    source = Path(shutil.copytree(exported_from, tmp_path / "hf"))
    before = onnx_export.source_fingerprint(source)
    kquants.apply_blocks(copy.deepcopy(model), "q4k", source)
    derived = [p.name for p in source.iterdir() if p.name.startswith("model.safetensors.")]
    assert any(name.endswith(".safetensors") for name in derived), derived  # the cache was written
    assert onnx_export.source_fingerprint(source) == before


def test_head_size_ort_cannot_run_is_refused_before_export(tmp_path, monkeypatch):
    recipe = tiny.TinyRecipe("llama", vocab_size=12, draft_vocab_size=12, hidden=32, heads=4)
    source = tiny.saved_folder("odd-heads", tiny.build_target(recipe), tiny.build_tokenizer(), tmp_path)
    monkeypatch.setattr(onnx_export, "export", lambda *a, **k: pytest.fail("exported"))
    with pytest.raises(UnsupportedError, match="head size 8 is not a multiple of 16"):
        models.load_ort_target("odd-heads", source, OrtSettings())
