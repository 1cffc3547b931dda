"""Where weights come from: explicit folder > environment variable > Hugging Face cache > packaged
parts > an error listing every place looked and how to fill one. Never the network."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers import load_pair

from harness.base.errors import VocabMismatchError, WeightsNotFoundError
from harness.decoding.generation import generate
from harness.pairs import models
from harness.settings.setup import GenerationSettings
from harness.weights import packaged, tiny, weights

LLAMA = ("llama-2-7b", "meta-llama/Llama-2-7b-hf", None)  # name, hf_id, packaged_key
QWEN = ("qwen2.5-coder-1.5b", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-coder-1.5b")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty HF cache and packaged cache, no weights folder from the environment."""
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.delenv(weights.WEIGHTS_ENV, raising=False)
    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path / "packaged-cache"))
    return hub


def fake_model_dir(folder: Path, *, weights_file: str | None = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    if weights_file:
        (folder / weights_file).write_bytes(b"not really weights")
    return folder


def fake_hf_cache(hub: Path, hf_id: str, commit: str = "0123abcd") -> Path:
    repo = hub / ("models--" + hf_id.replace("/", "--"))
    snapshot = fake_model_dir(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def fake_converted(key: str) -> Path:
    """A packaged model's converted folder as harness.weights.packaged marks it complete."""
    model = packaged.get_model(key)
    folder = fake_model_dir(packaged.converted_dir(model))
    files = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
    (folder / packaged.MARKER).write_text(json.dumps({"source_sha256": model.sha256, "files": files}))
    assert packaged.is_converted(model)
    return folder


def test_explicit_dir_wins_over_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = fake_model_dir(tmp_path / "explicit" / "llama-2-7b")
    from_env = fake_model_dir(tmp_path / "env" / "llama-2-7b")
    monkeypatch.setenv(weights.WEIGHTS_ENV, str(tmp_path / "env"))
    assert weights.locate(*LLAMA, weights_dir=str(tmp_path / "explicit")).path == explicit
    assert weights.resolve(*LLAMA, weights_dir=str(tmp_path / "explicit")) == explicit
    assert weights.resolve(*LLAMA) == from_env
    # An explicit folder without this model falls through to the next place, not to an error.
    (tmp_path / "other").mkdir()
    assert weights.resolve(*LLAMA, weights_dir=str(tmp_path / "other")) == from_env


@pytest.mark.parametrize("subfolder", ["llama-2-7b", "meta-llama/Llama-2-7b-hf", "meta-llama--Llama-2-7b-hf"])
def test_model_folder_may_use_the_short_or_hub_name(tmp_path: Path, subfolder: str) -> None:
    folder = fake_model_dir(tmp_path / subfolder)
    location = weights.locate(*LLAMA, weights_dir=str(tmp_path))
    assert (location.origin, location.path, location.present) == ("dir", folder, True)


def test_env_var_wins_over_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    snapshot = fake_hf_cache(isolated, LLAMA[1])
    location = weights.locate(*LLAMA)
    assert (location.origin, location.path) == ("hf-cache", snapshot)
    from_env = fake_model_dir(tmp_path / "env" / "Llama-2-7b-hf")
    monkeypatch.setenv(weights.WEIGHTS_ENV, str(tmp_path / "env"))
    assert weights.locate(*LLAMA).path == from_env


def test_hf_cache_found_through_the_legacy_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    legacy = tmp_path / "legacy-hub"
    snapshot = fake_hf_cache(legacy, LLAMA[1])
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(legacy))
    assert weights.resolve(*LLAMA) == snapshot


def test_hf_cache_wins_over_packaged(isolated: Path) -> None:
    converted = fake_converted(QWEN[2])
    location = weights.locate(*QWEN)
    assert (location.origin, location.path) == ("packaged", converted)
    snapshot = fake_hf_cache(isolated, QWEN[1])
    location = weights.locate(*QWEN)
    assert (location.origin, location.path) == ("hf-cache", snapshot)
    assert weights.resolve(*QWEN) == snapshot


def test_missing_weights_list_every_place_and_how_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "explicit").mkdir()
    (tmp_path / "env").mkdir()
    monkeypatch.setenv(weights.WEIGHTS_ENV, str(tmp_path / "env"))
    location = weights.locate(*LLAMA, weights_dir=str(tmp_path / "explicit"))
    assert (location.origin, location.present, location.path) == ("missing", False, None)
    with pytest.raises(WeightsNotFoundError) as info:
        weights.resolve(*LLAMA, weights_dir=str(tmp_path / "explicit"))
    message = str(info.value)
    for place in (tmp_path / "explicit", tmp_path / "env", tmp_path / "hub"):
        assert str(place) in message
    assert "meta-llama/Llama-2-7b-hf" in message
    for how in ("--weights_dir", weights.WEIGHTS_ENV, "pip install -e '.[weights]'"):
        assert how in message


def test_missing_weights_without_any_folder_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        WeightsNotFoundError, match=f"--weights_dir not given and {weights.WEIGHTS_ENV} not set"
    ):
        weights.resolve(*LLAMA)


@pytest.mark.parametrize("weights_file", [None, "model.gguf", "notes.txt"])
def test_folder_without_loadable_weights_is_not_accepted(tmp_path: Path, weights_file: str | None) -> None:
    folder = fake_model_dir(tmp_path / "llama-2-7b", weights_file=weights_file)
    assert weights.locate(*LLAMA, weights_dir=str(tmp_path)).present is False
    with pytest.raises(WeightsNotFoundError) as info:
        weights.resolve(*LLAMA, weights_dir=str(tmp_path))
    assert f"{folder} has config.json but no" in str(info.value)


@pytest.mark.parametrize(
    "weights_file", ["model.safetensors", "pytorch_model.bin", "model-00001-of-00002.safetensors"]
)
def test_folder_with_weights_is_accepted(tmp_path: Path, weights_file: str) -> None:
    folder = fake_model_dir(tmp_path / "llama-2-7b", weights_file=weights_file)
    assert weights.resolve(*LLAMA, weights_dir=str(tmp_path)) == folder


def test_hf_cache_snapshot_without_weights_is_not_accepted(isolated: Path) -> None:
    snapshot = fake_hf_cache(isolated, LLAMA[1])
    (snapshot / "model.safetensors").unlink()
    assert weights.locate(*LLAMA).present is False


def tiny_llama_2_7b(draft_vocab: int | None = None) -> models.PairSpec:
    """llama-2-7b's registration with the tiny pair's vocabularies: a folder found for a registered
    name must match the registered vocabulary, so the tiny stand-ins are looked up under this."""
    spec = models.get_pair("llama-2-7b")
    vocab = tiny.TINY_RECIPES["tiny-llama"]
    return dataclasses.replace(
        spec,
        target=dataclasses.replace(spec.target, vocab_size=vocab.vocab_size),
        draft=dataclasses.replace(spec.draft, vocab_size=draft_vocab or vocab.draft_vocab_size),
    )


def save_tiny_pair(root: Path, target_name: str = "llama-2-7b", draft_name: str = "llama-160m") -> None:
    """The tiny llama pair saved as if it were a registered 7B pair's real weights."""
    target = tiny.build_target("tiny-llama")
    draft = tiny.build_draft("tiny-llama", target)
    target.save_pretrained(root / target_name)
    tiny.build_tokenizer().save_pretrained(root / target_name)
    draft.save_pretrained(root / draft_name)


def test_resolved_folders_load_through_load_pair(tmp_path: Path) -> None:
    save_tiny_pair(tmp_path)
    pair = load_pair(
        tiny_llama_2_7b(), target_precision="fp32", draft_precision="fp32", weights_dir=str(tmp_path)
    )
    assert pair.origins == {"target": str(tmp_path / "llama-2-7b"), "draft": str(tmp_path / "llama-160m")}
    # The same weights as the in-memory tiny pair, so the same greedy output in both modes.
    reference = load_pair("tiny-llama")
    prompt = [tiny.BOS_ID, 50, 60, 70, 80]
    for mode in ("plain", "assisted"):
        settings = GenerationSettings(mode=mode, max_new_tokens=8, ignore_eos=True)
        assert generate(pair, prompt, settings).output_ids == generate(reference, prompt, settings).output_ids


def test_vocab_mismatch_in_saved_configs_fails_before_loading_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_tiny_pair(tmp_path)
    # The registry promises 32000 for both; the files on disk disagree (a 512 target, a 1024 draft).
    config_path = tmp_path / "llama-160m" / "config.json"
    config = json.loads(config_path.read_text())
    config["vocab_size"] = 1024
    config_path.write_text(json.dumps(config))

    def no_load(path: Path) -> None:
        raise AssertionError(f"{path} was loaded before the vocabularies were checked")

    monkeypatch.setattr(models, "_load_hf", no_load)
    with pytest.raises(VocabMismatchError, match="1024"):
        load_pair(
            tiny_llama_2_7b(draft_vocab=1024), target_precision="fp32", draft_precision="fp32",
            weights_dir=str(tmp_path),
        )  # fmt: skip


def test_load_pair_reports_missing_weights_for_a_registered_pair(tmp_path: Path) -> None:
    with pytest.raises(WeightsNotFoundError, match="llama-2-7b"):
        load_pair("llama-2-7b", target_precision="fp32", draft_precision="fp32", weights_dir=str(tmp_path))


def test_weights_dir_from_env_var_reaches_load_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_tiny_pair(tmp_path, "Llama-2-7b-hf", "JackFram--llama-160m")
    monkeypatch.setenv(weights.WEIGHTS_ENV, str(tmp_path))
    pair = load_pair(tiny_llama_2_7b(), target_precision="fp32", draft_precision="fp32", with_draft=True)
    assert pair.origins["target"].endswith("Llama-2-7b-hf")
    assert pair.origins["draft"].endswith("JackFram--llama-160m")
    with torch.inference_mode():
        assert pair.target(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 512)
