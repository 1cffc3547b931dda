"""Reconcile a draft whose vocabulary is a prefix of the target's (CodeLlama 32016 vs Llama 32000).

The seeds' originals padded the draft's logits; we do the same, and also grow the draft's input
embedding so target tokens past the draft's vocabulary (CodeLlama's infilling specials) can be fed
back to the draft. The padded logits are the lowest finite value, so the draft never proposes a token
it does not know: padding changes neither the draft's choices nor the target's output.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from harness.base.errors import VocabMismatchError

# Targets may append a few specials to the draft's vocabulary (CodeLlama adds 16). Anything larger
# is a different tokenizer, where ids would mean different strings and padding would be wrong.
MAX_EXTRA_TOKENS = 256


def vocab_size(model: PreTrainedModel) -> int:
    # From the config, not the output layer: a quantized output layer may hold no plain weight.
    return int(model.config.vocab_size)


def check_reconcilable(
    target_vocab: int, draft_vocab: int, *, target: str = "target", draft: str = "draft"
) -> int:
    """Return how many logits to pad the draft with, or explain why the pair cannot be used."""
    extra = target_vocab - draft_vocab
    if extra < 0 or extra > MAX_EXTRA_TOKENS:
        raise VocabMismatchError(
            f"draft {draft!r} has a vocabulary of {draft_vocab} tokens and target {target!r} has "
            f"{target_vocab}: the draft's vocabulary must be the target's or a prefix of it (at most "
            f"{MAX_EXTRA_TOKENS} extra target tokens, as CodeLlama's 32016 over Llama's 32000). "
            "Choose a draft built on the target's tokenizer (see --list-models)."
        )
    return extra


def pad_draft_vocab(draft: PreTrainedModel, target_vocab: int) -> PreTrainedModel:
    """Make the draft speak the target's vocabulary size; a no-op when they already match."""
    draft_vocab = vocab_size(draft)
    extra = check_reconcilable(target_vocab, draft_vocab)
    if extra == 0:
        return draft
    embeddings = draft.get_input_embeddings()
    with torch.no_grad():
        grown = torch.nn.Embedding(target_vocab, embeddings.weight.shape[1], dtype=embeddings.weight.dtype)
        grown.weight[:draft_vocab] = embeddings.weight
        # Unknown-to-the-draft tokens read as the mean embedding: any fixed vector would do, the
        # draft only needs to keep going after the target emits one.
        grown.weight[draft_vocab:] = embeddings.weight.mean(dim=0)
    draft.set_input_embeddings(grown)

    def pad_logits(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        fill = torch.finfo(output.dtype).min
        pad = output.new_full((*output.shape[:-1], extra), fill)
        return torch.cat([output, pad], dim=-1)

    draft.get_output_embeddings().register_forward_hook(pad_logits)
    draft.config.vocab_size = target_vocab
    draft.config.tie_word_embeddings = False
    return draft


class VocabSubsetHead(torch.nn.Module):
    """A draft output layer that scores only ``keep`` token ids (a prefix of the vocabulary plus
    the special tokens at its end) and returns full-size logits, the rest at the lowest finite value.

    Why: a 0.5B draft's 151,936 x 896 output layer is about a quarter of its work per token, and
    most of that vocabulary is never proposed. The draft still proposes only real token ids and the
    target still decides every token, so this changes speed and acceptance, never output.
    """

    def __init__(self, inner: torch.nn.Module, prefix: int, tail_start: int, full_size: int) -> None:
        super().__init__()
        self.inner = inner  # a linear layer over the kept rows: [0, prefix) then [tail_start, full_size)
        self.prefix = prefix
        self.tail_start = tail_start
        self.full_size = full_size
        # The token id of each kept row, in the rows' (increasing) order.
        self.token_ids = torch.cat([torch.arange(prefix), torch.arange(tail_start, full_size)])
        self.compact = False  # set by ``compact_logits``: return the kept rows' scores alone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = self.inner(x)
        if self.compact:
            return small
        out = small.new_full((*small.shape[:-1], self.full_size), torch.finfo(small.dtype).min)
        out[..., : self.prefix] = small[..., : self.prefix]
        out[..., self.tail_start :] = small[..., self.prefix :]
        return out


@contextmanager
def compact_logits(draft: PreTrainedModel) -> Iterator[torch.Tensor | None]:
    """While active, a draft whose output layer scores a subset (``VocabSubsetHead``) returns the
    subset's scores alone; yields the token id of each of their columns (None: the draft scores the
    whole vocabulary, and its logits are as always).

    Why: a loop that only ranks the draft's scores (argmax, top-k, the top token's probability) read
    the full 151,936-wide logits three times per draft step, ~0.8 ms of a 0.5B draft's ~9 ms step
    on AMD EPYC Zen 4, where the ~16K kept scores take a tenth of it. The ranking is the same (the
    full logits hold the kept scores in the same order, the rest at the lowest finite value, never
    the top), and so is a softmax up to its sum's rounding: each of the rest adds exactly 0."""
    head = draft.get_output_embeddings()
    if not isinstance(head, VocabSubsetHead):
        yield None
        return
    head.compact = True
    try:
        yield head.token_ids
    finally:
        head.compact = False


def restrict_draft_vocab(
    draft: PreTrainedModel, keep: int, specials_from: int | None = None
) -> PreTrainedModel:
    """Make the draft score only token ids below ``keep`` and those from ``specials_from`` on (the
    tokenizer's added special tokens, EOS among them). Byte-level BPE vocabularies are ordered by
    merge rank, so the low ids are the frequent ones. Apply before quantizing the draft, so the
    smaller layer is what gets quantized."""
    head = draft.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise VocabMismatchError(
            f"--draft_vocab needs a plain linear output layer without bias; {type(draft).__name__} has "
            f"{type(head).__name__}"
        )
    full = vocab_size(draft)
    tail = full if specials_from is None else specials_from
    if not 0 < keep <= tail <= full:
        raise VocabMismatchError(
            f"--draft_vocab {keep} must be between 1 and {tail} (the draft scores {full} tokens)"
        )
    rows = torch.cat([head.weight[:keep], head.weight[tail:full]]).detach().clone()
    inner = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False, dtype=rows.dtype)
    with torch.no_grad():
        inner.weight.copy_(rows)
    draft.set_output_embeddings(VocabSubsetHead(inner, keep, tail, full))
    # The new layer holds its own rows: a later tie_weights() must not point it at the embedding.
    draft.config.tie_word_embeddings = False
    tied = getattr(draft, "all_tied_weights_keys", None)
    if isinstance(tied, dict):
        tied.clear()
    return draft
