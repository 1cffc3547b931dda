"""Draft options: a draft that scores only part of the vocabulary, or runs the harness kernels: faster
drafts, never another output."""

from __future__ import annotations

import pytest
import torch
from helpers import load_pair

from harness.base import vocab
from harness.base.errors import HarnessError
from harness.decoding.generation import generate
from harness.experiments import sweep
from harness.settings import configs
from harness.settings.setup import GenerationSettings

IDS = list(range(3, 40))


@pytest.mark.parametrize("draft_precision", ["fp32", "w8af32"])
def test_restricted_draft_keeps_output_and_still_drafts(draft_precision):
    full = load_pair("tiny-qwen2", draft_precision=draft_precision)
    cut = load_pair("tiny-qwen2", draft_precision=draft_precision, draft_vocab=100)
    s = GenerationSettings(mode="assisted", max_new_tokens=16, ignore_eos=True)
    plain = generate(full, IDS, GenerationSettings(max_new_tokens=16, ignore_eos=True))
    a, b = generate(full, IDS, s), generate(cut, IDS, s)
    assert a.output_ids == b.output_ids == plain.output_ids
    assert b.drafted > 0
    assert isinstance(cut.draft.get_output_embeddings(), vocab.VocabSubsetHead)


def test_restricted_draft_never_scores_a_dropped_token():
    pair = load_pair("tiny-llama", draft_vocab=50)
    with torch.inference_mode():
        logits = pair.draft(torch.tensor([IDS])).logits[0]
    size = int(pair.target.config.vocab_size)
    assert logits.shape[-1] == size
    floor = torch.finfo(logits.dtype).min
    assert bool((logits[:, 50:] == floor).all())
    assert bool((logits[:, :50] > floor).all())
    assert int(logits[-1].argmax()) < 50


def test_compact_logits_rank_the_kept_tokens_as_the_full_logits_do():
    pair = load_pair("tiny-llama")
    draft = vocab.restrict_draft_vocab(pair.draft, 40, specials_from=500)
    with torch.inference_mode():
        full = draft(torch.tensor([IDS])).logits[0]
        with vocab.compact_logits(draft) as ids:
            small = draft(torch.tensor([IDS])).logits[0]
        again = draft(torch.tensor([IDS])).logits[0]
    size = int(pair.target.config.vocab_size)
    assert ids.tolist() == [*range(40), *range(500, size)]
    assert small.shape[-1] == len(ids) and torch.equal(full[:, ids], small)
    assert torch.equal(ids[small.topk(5, dim=-1).indices], full.topk(5, dim=-1).indices)
    assert torch.equal(ids[small.argmax(dim=-1)], full.argmax(dim=-1))
    assert torch.equal(again, full)  # full logits again once the block ends
    with vocab.compact_logits(load_pair("tiny-llama").draft) as none:
        assert none is None  # a draft scoring the whole vocabulary is left as it is


def test_special_tokens_stay_proposable():
    pair = load_pair("tiny-llama")
    draft = vocab.restrict_draft_vocab(pair.draft, 40, specials_from=500)
    with torch.inference_mode():
        logits = draft(torch.tensor([IDS])).logits[0]
    floor = torch.finfo(logits.dtype).min
    assert bool((logits[:, 500:] > floor).all()) and bool((logits[:, 40:500] == floor).all())


@pytest.mark.parametrize("keep", [-5, 10**6])
def test_bad_draft_vocab_is_a_clear_error(keep):
    with pytest.raises(HarnessError, match="--draft_vocab"):
        load_pair("tiny-qwen2", draft_vocab=keep)


def test_sweep_spec_takes_dv():
    (config,) = configs.parse_configs("t=fp32,d=w8af32,k=3,dv=32768")
    assert config.draft_vocab == 32768 and config.label.endswith("-dv32768")
    with pytest.raises(HarnessError, match="dv"):
        configs.parse_configs("t=fp32,mode=prompt_lookup,dv=100")
    with pytest.raises(HarnessError, match="dv"):
        configs.parse_configs("t=fp32,dv=lots")


def test_sweep_loads_a_restricted_draft_beside_a_full_one():
    pairs = sweep.load_target_group(
        "tiny-qwen2", target_precision="fp32", draft_precisions=[("fp32", None), ("fp32", 64)]
    )
    assert set(pairs) == {("fp32", None), ("fp32", 64)}
    assert pairs[("fp32", 64)].draft_setup.vocab == 64
    assert isinstance(pairs[("fp32", 64)].draft.get_output_embeddings(), vocab.VocabSubsetHead)
    assert pairs[("fp32", None)].target is pairs[("fp32", 64)].target


def test_draft_on_the_harness_kernels_keeps_output():
    from harness.kernels import invariant

    pair = load_pair("tiny-qwen2", draft_precision="w8af32", draft_kernels="invariant", draft_vocab=100)
    assert any(isinstance(m, invariant.InvariantLinear) for m in pair.draft.modules())
    assert not any(isinstance(m, invariant.InvariantLinear) for m in pair.target.modules())
    s = GenerationSettings(mode="assisted", max_new_tokens=16, ignore_eos=True)
    plain = generate(pair, IDS, GenerationSettings(max_new_tokens=16, ignore_eos=True))
    assisted = generate(pair, IDS, s)
    assert assisted.output_ids == plain.output_ids and assisted.drafted > 0
    with pytest.raises(HarnessError, match="--draft_kernels"):
        load_pair("tiny-qwen2", draft_kernels="turbo")


def test_sweep_spec_takes_dk():
    (config,) = configs.parse_configs("t=fp32,d=w8af32,k=3,dv=100,dk=invariant")
    assert config.draft_key == ("w8af32", 100, "invariant") and config.label.endswith("-dk_invariant")
    pairs = sweep.load_target_group(
        "tiny-qwen2", target_precision="fp32", draft_precisions=[config.draft_key]
    )
    assert pairs[config.draft_key].draft_setup.kernels == "invariant"
    with pytest.raises(HarnessError, match="dk"):
        configs.parse_configs("t=fp32,d=fp32,dk=fast")


def test_draft_vocab_zero_means_the_whole_vocabulary():
    pair = load_pair("tiny-qwen2", draft_vocab=0)
    assert pair.draft_setup.vocab is None
    assert not isinstance(pair.draft.get_output_embeddings(), vocab.VocabSubsetHead)
