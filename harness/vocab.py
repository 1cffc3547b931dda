"""Reconcile a draft whose vocabulary is a prefix of the target's (CodeLlama 32016 vs Llama 32000).

The seeds' originals padded the draft's logits; we do the same, and also grow the draft's input
embedding so target tokens past the draft's vocabulary (CodeLlama's infilling specials) can be fed
back to the draft. The padded logits are the lowest finite value, so the draft never proposes a token
it does not know: padding changes neither the draft's choices nor the target's output.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from harness.errors import VocabMismatchError

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
