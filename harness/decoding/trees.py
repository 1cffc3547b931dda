"""Greedy assisted decoding with a static token tree (SpecInfer, Sequoia): the harness's own loop.

transformers' assisted loop verifies a chain only, so a tree needs a loop of its own. Each round:

1. The draft proposes the tree (``theory.trees.Tree``: rank paths): one forward over the tokens it
   has not yet seen, then one forward per level over that level's nodes with children, each node's
   children being its prediction's top ranks.
2. The target verifies the round's last token and every node in one forward. A node's row attends
   to the cache, the round's last token, its ancestors and itself (``fused.FusedStack``'s
   ``tree_mask``), at the position its depth gives it.
3. The longest path whose tokens are the target's own greedy choices is accepted, with the target's
   next token after it; both caches keep only that path (``keep_path``).

Why it is the target's own output, bit for bit: the fused layers compute each row on its own in one
fixed order, and attention skips every key a row does not see (``kernels/invariant.cpp``), so a
node's row is exactly the one-token step a plain decode makes at that position with that prefix.
It therefore runs on the batch-invariant kernels only (the fused layers), and refuses anything else.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from harness.base import vocab
from harness.base.errors import HarnessError
from harness.decoding.context import ContextProposer, RoundPlan
from harness.kernels import fused
from harness.pairs.models import LoadedPair
from harness.settings.setup import GenerationSettings, prompt_digest
from harness.theory.timing import Measurement, record_forwards
from harness.theory.trees import Path, Tree


def check_pair(pair: LoadedPair) -> None:
    """Refuse a pair a tree cannot run on exactly: both models must be on the fused layers."""
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        if model is None:
            raise HarnessError(f"{pair.spec.name} was loaded without a draft; a token tree needs one")
        stack = getattr(model, "model", None)
        if not isinstance(stack, fused.FusedStack):
            raise HarnessError(
                f"a token tree (--draft_tree) and proposals from the context (--context_draft) run on the "
                f"harness's batch-invariant kernels only, and the {role} is not on them: use "
                "--target_kernels invariant and --draft_kernels invariant, or a block precision (gguf, q4k)"
            )


@functools.lru_cache(maxsize=256)
def tree_mask(rows: tuple[Path, ...], seen: tuple[Path, ...]) -> torch.Tensor:
    """Which of the cache's last ``len(seen)`` entries (the nodes ``seen``, in cache order) each of
    ``rows`` (the last ones, each in ``seen``) attends to: its ancestors and itself. Cached: a
    static tree asks for the same few masks every round (read only, never written to)."""
    mask = torch.zeros(len(rows), len(seen), dtype=torch.bool)
    for i, row in enumerate(rows):
        for j, entry in enumerate(seen):
            mask[i, j] = row[: len(entry)] == entry
    return mask


@functools.lru_cache(maxsize=64)
def verify_mask(nodes: tuple[Path, ...]) -> torch.Tensor | None:
    """The target's mask for a round's nodes, the forward's last rows: each sees every entry before
    the nodes (the prefix and the round's pending tokens, which stay causal among themselves), its
    ancestors and itself. Only the nodes' rows are masked: a first round's mask over the whole prompt
    would cost its prefill more than the prompt's arithmetic."""
    return tree_mask(nodes, nodes) if nodes else None


def keep_path(cache: DynamicCache, start: int, entries: Sequence[int]) -> None:
    """Keep the cache's first ``start`` entries and then ``entries`` (increasing indices, each at or
    after its new place), dropping the rest: a round's accepted path moved down onto the prefix."""
    moves = [(start + i, e) for i, e in enumerate(entries) if e != start + i]
    if moves:  # a path along the stored order (a chain's) is in place already
        to, source = (torch.tensor(x) for x in zip(*moves, strict=True))
        for layer in cache.layers:
            for tensor in (layer.keys, layer.values):
                tensor[..., to, :] = tensor[..., source, :]  # gathered first, then written
    extra = cache.get_seq_length() - start - len(entries)
    if extra > 0:
        cache.crop(-extra)  # a count to remove, in transformers' 5.x spelling


def _forward(
    model: torch.nn.Module,
    ids: Sequence[int],
    cache: DynamicCache,
    positions: Sequence[int],
    mask: Any,
    keep: int = 0,
) -> torch.Tensor:
    """The logits of the last ``keep`` rows (0: every row). A prompt's rows need none: their output
    layer over a 150K-token vocabulary would cost a long prompt's prefill about a third again."""
    out = model(
        input_ids=torch.tensor([list(ids)], dtype=torch.long),
        position_ids=torch.tensor([list(positions)], dtype=torch.long),
        past_key_values=cache,
        use_cache=True,
        tree_mask=None if mask is None or _causal(mask) else mask,
        logits_to_keep=keep,
    )
    return out.logits[0].float()


def _causal(mask: torch.Tensor) -> bool:
    """Whether a mask over the cache's last entries shows each row what causal attention does (a
    chain's, as the chain of K and every proposal from the context are): then the forward is run
    unmasked, with the same bits (attention sums the same keys in the same order either way) and
    without the masked path's per-row key lists, 0.8 ms of a 4-row verification of the 1.5B target
    and 0.2 ms of a draft step of the 0.5B (AMD EPYC Zen 4, interleaved, logits equal)."""
    rows, width = mask.shape
    return bool(torch.equal(mask, torch.ones(rows, width, dtype=torch.bool).tril(width - rows)))


def _mask_of(ids: set[int], width: int) -> torch.Tensor:
    mask = torch.zeros(1, width, dtype=torch.bool)
    mask[0, sorted(ids)] = True
    return mask


def _cut(tree: Tree, depth: int) -> list[Path]:
    return [p for p in tree.nodes if len(p) <= depth]


# With proposals from the context, the draft model reads a prompt longer than DRAFT_WINDOW tokens
# from its last DRAFT_READ tokens only: on a CPU the prefill of a long prompt dominates a request,
# and the draft's own (about a third of the target's for this pair) would come on top of the
# target's, while a long prompt's copies come from the context. What it reads never changes the
# output, which the target verifies. On 8K-token prompts the draft agreed with the target as often
# after 128 tokens as after 256; after 64 it kept as much at 1K and 2K, its first read took 87-100 ms
# against 191-376 for 128, and the requests decoded in 0.81-1.05x the time (AMD EPYC Zen 4,
# interleaved; docs/FINDINGS.md). Prompts up to DRAFT_WINDOW tokens are read whole.
# (A tree or chain alone reads the whole prompt, as the tree planner's predictions assume.)
DRAFT_WINDOW = 128
DRAFT_READ = 64


class _Draft:
    """The draft's side of the rounds: its cache (from ``start`` on: a long prompt's recent window),
    and the tokens it has not seen yet."""

    def __init__(self, model: torch.nn.Module, window: int | None = None) -> None:
        self.model = model
        self.window = window  # the most of a prompt it reads (None: all of it)
        self.cache = DynamicCache()
        self.start = 0  # the sequence index of the cache's first entry
        self.rows: dict[Path, int] = {}  # a node of this round -> its entry in the draft's cache

    def propose(self, seq: list[int], nodes: list[Path], threshold: float = 0.0) -> dict[Path, int]:
        """Each node's token for the sequence ``seq`` (the prefix and the round's last token). A chain
        stops at the first token the draft gives less than ``threshold`` of its probability (that
        token still proposed), as transformers' dynamic schedule stops its drafts; a tree is whole."""
        with vocab.compact_logits(self.model) as ids:
            return self._propose(seq, nodes, threshold, ids)

    def _propose(
        self, seq: list[int], nodes: list[Path], threshold: float, ids: torch.Tensor | None
    ) -> dict[Path, int]:
        """``propose`` with the draft's scores in columns of token ids ``ids`` (None: every id)."""
        if self.cache.get_seq_length() == 0 and self.window is not None:
            self.start = max(0, len(seq) - self.window)
        seen = self.start + self.cache.get_seq_length()
        logits = _forward(self.model, seq[seen:], self.cache, range(seen, len(seq)), None, keep=1)
        parents: list[Path] = [()]
        tokens: dict[Path, int] = {}
        self.rows = {}
        expanded: list[Path] = []
        depth = 0
        while parents:
            ranks = 1 + max(p[-1] for p in nodes if len(p) == depth + 1)
            top = torch.topk(logits, ranks, dim=-1).indices
            top[:, 0] = logits.argmax(dim=-1)  # ties: rank 0 is what greedy drafting takes
            if ids is not None:
                top = ids[top]
            for i, parent in enumerate(parents):
                for p in nodes:
                    if len(p) == depth + 1 and p[:-1] == parent:
                        tokens[p] = int(top[i, p[-1]])
            if threshold > 0 and len(parents) == 1 and float(logits[0].softmax(-1).max()) < threshold:
                break  # unsure of this token: the chain ends with it
            depth += 1
            parents = [p for p in nodes if len(p) == depth and any(q[:-1] == p for q in nodes)]
            if not parents:
                break
            first = self.cache.get_seq_length()
            for i, p in enumerate(parents):
                self.rows[p] = first + i
            expanded += parents
            mask = tree_mask(tuple(parents), tuple(expanded))
            position = len(seq) - 1 + depth
            logits = _forward(
                self.model, [tokens[p] for p in parents], self.cache, [position] * len(parents), mask
            )
        return tokens

    def accept(self, seq_before: int, path: list[Path]) -> None:
        """Keep the prefix of ``seq_before`` tokens and the accepted nodes the draft has entries for
        (none after a round proposed from the context: the draft catches up when next asked)."""
        keep = [self.rows[p] for p in path if p in self.rows]
        keep_path(self.cache, seq_before - self.start, keep)
        self.rows = {}


def decode(pair: LoadedPair, prompt_ids: Sequence[int], settings: GenerationSettings) -> Measurement:
    """Decode one prompt greedily with the settings' tree (``draft_tree``; else a chain of K), and
    with proposals from the context where it has them (``context_draft``), measured as
    ``generation.generate`` measures transformers' loop."""
    check_pair(pair)  # the settings were validated by ``generation.generate`` (greedy)
    tree = Tree.parse(settings.draft_tree or _chain(settings.num_assistant_tokens))
    plan = RoundPlan(ContextProposer(settings.context_draft)) if settings.context_draft else None
    # A chain's dynamic schedule (its confidence threshold) holds in this loop as in transformers'.
    threshold = 0.0 if settings.draft_tree else settings.confidence_threshold_in_effect
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise HarnessError("empty prompt: give at least one token")
    eos = (
        None
        if settings.ignore_eos
        else (settings.eos_token_id if settings.eos_token_id is not None else pair.eos_token_id)
    )
    stops = set(eos if isinstance(eos, list | tuple) else [eos]) - {None}
    # A synthetic verdict (``synthetic_acceptance``): the draft's first choice at each depth accepted
    # with probability p by a draw seeded by the seed and the prompt, so a rerun repeats its rounds
    # and different prompts draw apart (one sequence for all would correlate a run's prompts).
    synthetic = settings.synthetic_acceptance
    seeded = random.Random(f"{settings.seed}-{prompt_digest(prompt)}") if synthetic is not None else None
    draw = seeded.random if seeded is not None else None
    budget = settings.max_new_tokens
    # Plain steps in place of a losing chain only where the draft reads a window of the prompt, where
    # it foresees least: on shorter prompts the chain ran 1.06-1.30x plain decoding over the mixed
    # prompts with or without them (interleaved, AMD EPYC Zen 4), and the choice, timed, would make
    # the rounds of the exact acceptance gate's prompt depend on the host's speed.
    windowed = plan is not None and len(prompt) > DRAFT_WINDOW
    draft = _Draft(pair.draft, DRAFT_READ if windowed else None)
    target_cache = DynamicCache()
    drafted = accepted = from_context = 0
    judged: list[list[bool]] = []
    out: list[int] = []

    def finished() -> bool:
        if len(out) >= budget or (stops and any(t in stops for t in out)):
            return True
        text = pair.tokenizer.decode(out) if settings.stop_strings else ""
        return any(s in text for s in settings.stop_strings)

    with torch.inference_mode(), record_forwards({"target": pair.target, "draft": pair.draft}) as log:
        start = time.perf_counter()
        while not finished():
            began = time.perf_counter()
            seq = prompt + out
            # A round emits its accepted nodes and one token more: never past the budget. The first
            # round verifies the prompt with its nodes, as transformers' assisted loop does.
            room = budget - len(out) - 1
            found: list[int] = []
            chain = room > 0
            if plan is not None:
                plan.context.extend(seq)
                found = plan.choose(plan.context.propose(room))
                chain = chain and not found and (not windowed or plan.chain.runs())
            mark = len(log.forwards)
            extended = 0
            if found:  # the context's continuation, as a chain: no draft forward this round
                nodes = [(0,) * (i + 1) for i in range(len(found))]
                tokens = dict(zip(nodes, found, strict=True))
            elif chain:
                depth = room
                if plan is not None and not settings.draft_tree:
                    depth = min(room, plan.depth(settings.num_assistant_tokens, windowed))
                tokens = draft.propose(seq, _cut(tree, depth), threshold)
                nodes = [p for p in _cut(tree, depth) if p in tokens]
                if plan is not None and nodes and not settings.draft_tree:
                    # A copy that starts with the draft's guesses goes on from the context.
                    more = plan.extension([tokens[p] for p in nodes], room - len(nodes))
                    for t in more:
                        nodes.append((0,) * (len(nodes) + 1))
                        tokens[nodes[-1]] = t
                    extended = len(more)
            else:  # the budget's last token, or a plain step where the chain has not paid
                tokens, nodes = {}, []
            seen = target_cache.get_seq_length()
            verify = _forward(
                pair.target,
                [*seq[seen:], *(tokens[p] for p in nodes)],
                target_cache,
                [*range(seen, len(seq)), *(len(seq) - 1 + len(p) for p in nodes)],
                verify_mask(tuple(nodes)),
                keep=1 + len(nodes),
            )
            scores = verify  # the root's row, then the nodes'
            if stops and len(out) < settings.min_new_tokens:
                # As transformers' min-new-tokens processor: no EOS before the floor, per emitted position.
                early = [len(out) + len(p) < settings.min_new_tokens for p in ((), *nodes)]
                scores[torch.tensor(early)[:, None] & _mask_of(stops, scores.shape[-1])] = -math.inf
            best = scores.argmax(dim=-1).tolist()
            rows: list[Path] = [(), *nodes]
            path: list[Path] = []
            node: Path = ()
            rejected = False
            while True:
                token = best[rows.index(node)]
                children = [p for p in nodes if p[:-1] == node]
                if draw is None:
                    child = next((p for p in children if tokens[p] == token), None)
                else:  # accepted: the draft's token is emitted, as if the target had chosen it
                    child = min(children) if children and draw() < synthetic else None
                    token = tokens[child] if child is not None else token
                out.append(token)
                if child is None:
                    rejected = bool(children)  # a leaf ends the path without a verdict
                    break
                path.append(child)
                node = child
                if finished():
                    break
            drafted += len(nodes)
            accepted += len(path)
            if plan is not None:
                copied = 0
                if found:
                    plan.context.verified(len(nodes), len(path))
                    copied = len(path)
                elif chain and nodes and not settings.draft_tree:
                    drafted_here = len(nodes) - extended
                    plan.chain_kept(drafted_here, min(len(path), drafted_here))
                    if extended:
                        copied = max(0, len(path) - drafted_here)  # the context's tokens kept
                        plan.context.verified(extended, copied)
                from_context += copied
                plan.round_kept(copied)
                if seen > 0:  # a prompt's forward says nothing of a round's cost
                    verified = log.forwards[-1]
                    plan.observe(verified.input_tokens, verified.ms)
            if nodes and all(n == (0,) * len(n) for n in nodes):
                # A chain, counted as transformers' loop counts one: every proposed position drafted,
                # accepted up to the first miss.
                judged.append([True] * len(path) + [False] * (len(nodes) - len(path)))
            elif nodes:  # (a plain step judges nothing)
                # A tree, along the path taken: each depth accepted, then the one whose children all missed.
                judged.append([True] * len(path) + [False] * rejected)
            keep_path(target_cache, len(seq), [len(seq) + nodes.index(p) for p in path])
            draft.accept(len(seq), path)
            if windowed and seen > 0 and not found:
                ms = (time.perf_counter() - began) * 1000.0
                if chain:  # the draft's first read of its window is the request's, not a round's
                    drafts = [f for f in log.forwards[mark:] if f.role == "draft"]
                    window = sum(f.ms for f in drafts if not f.cache_tokens)
                    for f in drafts:
                        if f.cache_tokens and f.input_tokens == 1:
                            plan.draft_step(f.ms)
                    plan.chain.chain_round(len(path) + 1, ms - window)
                else:
                    plan.chain.plain_step(ms)
        end = time.perf_counter()
    # Nothing to cut: a round's nodes stop short of the budget, and a path ends at an EOS.
    m = Measurement.of_log(log, start, end, len(prompt), out, drafted, accepted, judged)
    return dataclasses.replace(m, from_context=from_context) if plan is not None else m


def _chain(k: int) -> str:
    """A chain of K as a tree's spelling: the draft's first choice at each depth."""
    return "+".join("0" * depth for depth in range(1, k + 1))
