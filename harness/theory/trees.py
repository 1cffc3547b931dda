"""Token trees: which candidates a round verifies, what it accepts, what it costs.

A static tree of candidates (SpecInfer, Sequoia) is a set of rank paths: the node ``(r0, ..., rd)``
is the draft's ``rd``-th most likely token after the path ``(r0, ..., rd-1)``, and the target
verifies the round's last token and every node in one forward. A chain of K is ``{(0,), (0, 0),
..., (0,) * K}``.

Under greedy decoding the target's token at each position is fixed: its plain output. A round
that starts at output position ``p`` therefore accepts the longest path of the tree that spells the
ranks of the target's tokens ``p, p+1, ...`` among the draft's predictions, each made after the
true prefix (a node off the true path is never built on). So what any tree accepts on a decode is
read off one table, each output position's rank in the draft's prediction there (``ranks``), and
measured exactly without a tree verifier; the chain read the same way must equal what a real
assisted run accepted, which is how the table is checked.

What a round costs comes from the forward-cost table (ms of one forward of M tokens): the draft
runs one forward per tree level (its rows: the level's nodes that have children), the target one
forward of ``1 + size`` rows.

Nothing here loads a model or reads a clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.base.errors import HarnessError

# A position whose target token is not among the draft's recorded top ranks.
MISS = -1

Path = tuple[int, ...]


@dataclass(frozen=True)
class Tree:
    """A static candidate tree: its rank paths, each one's parent present, shortest first."""

    nodes: tuple[Path, ...]

    @classmethod
    def of(cls, paths: Sequence[Sequence[int]]) -> Tree:
        nodes = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
        have = set(nodes)
        for p in nodes:
            if not p or any(r < 0 for r in p):
                raise HarnessError(f"a tree node is a non-empty path of ranks >= 0, not {p}")
            if len(p) > 1 and p[:-1] not in have:
                raise HarnessError(f"tree node {p} has no parent {p[:-1]}")
        return cls(tuple(nodes))

    @classmethod
    def chain(cls, k: int) -> Tree:
        return cls.of([(0,) * d for d in range(1, k + 1)])

    @classmethod
    def parse(cls, spec: str) -> Tree:
        """A tree from its spelling (``spec``): rank paths joined by ``+``, one digit a rank, e.g.
        ``0+1+00+000`` (the draft's first and second choice, then two more first choices under the
        first). Not commas: the sweep's spelling separates its keys with them."""
        words = [w.strip() for w in spec.split("+") if w.strip()]
        if not words or any(not w.isdigit() for w in words):
            raise HarnessError(
                f"a tree is rank paths of digits joined by +, e.g. 0+1+00+000 (a chain of 3 is "
                f"0+00+000), not {spec!r}"
            )
        return cls.of([[int(c) for c in w] for w in words])

    def spec(self) -> str:
        """The spelling ``parse`` reads (ranks past 9 have none)."""
        if any(r > 9 for p in self.nodes for r in p):
            raise HarnessError("a tree with ranks past 9 has no spelling")
        return "+".join("".join(str(r) for r in p) for p in self.nodes)

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.nodes), default=0)

    @property
    def verify_rows(self) -> int:
        """Rows of the target's verify forward: the round's last accepted token and every node."""
        return 1 + self.size

    def draft_rows(self) -> list[int]:
        """Rows of the draft's forward at each level: the root, then each level's nodes with children."""
        parents = Counter(len(p) for p in {q[:-1] for q in self.nodes if len(q) > 1})
        return [1, *(parents[d] for d in range(1, self.depth))] if self.nodes else []

    def is_chain(self) -> bool:
        return all(set(p) == {0} for p in self.nodes)

    def label(self) -> str:
        """Nodes per depth, e.g. ``2-2-1``; a chain reads ``chain K``."""
        if self.is_chain():
            return f"chain {self.depth}"
        width = Counter(len(p) for p in self.nodes)
        return "-".join(str(width[d]) for d in range(1, self.depth + 1))

    def accepted(self, ranks: Sequence[int], limit: int) -> int:
        """Candidates a round accepts when the target's tokens have ``ranks`` from its start, with at
        most ``limit`` candidates (the budget left)."""
        have = set(self.nodes)
        d = 0
        while d < min(limit, len(ranks)) and ranks[d] != MISS and tuple(ranks[: d + 1]) in have:
            d += 1
        return d


@dataclass(frozen=True)
class Rounds:
    """What a tree does over one decode: its rounds and the candidates they accepted."""

    rounds: int
    accepted: int
    tokens: int

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0


def simulate(tree: Tree, ranks: Sequence[int]) -> Rounds:
    """The rounds of a greedy decode of ``len(ranks)`` tokens with ``tree``: each round accepts its
    longest true path and adds the target's own next token; a round never proposes more candidates
    than the tokens left after that one (as transformers' assisted decoding caps K)."""
    n, p, rounds, accepted = len(ranks), 0, 0, 0
    while p < n:
        d = tree.accepted(ranks[p:], n - p - 1)
        rounds, accepted, p = rounds + 1, accepted + d, p + d + 1
    return Rounds(rounds, accepted, n)


def path_counts(ranks: Sequence[int], depth: int) -> Counter[Path]:
    """How often each rank path of length 1..``depth`` starts at an output position."""
    counts: Counter[Path] = Counter()
    for p in range(len(ranks)):
        for d in range(1, depth + 1):
            path = tuple(ranks[p : p + d])
            if len(path) < d or MISS in path:
                break
            counts[path] += 1
    return counts


def grow(counts: Mapping[Path, int], size: int) -> Tree:
    """The tree of ``size`` nodes that accepts the most on the counted paths: the most frequent
    paths (shorter first on ties). A path is never more frequent than its parent, so these are
    prefix-closed; this is Sequoia's and EAGLE-2's choice with acceptance measured per path rather
    than modelled per depth and rank."""
    order = sorted(counts, key=lambda p: (-counts[p], len(p), p))
    chosen: list[Path] = []
    have: set[Path] = set()
    for p in order:
        if len(chosen) == size:
            break
        if len(p) == 1 or p[:-1] in have:
            chosen.append(p)
            have.add(p)
    return Tree.of(chosen)


def cost_at(costs: Mapping[int, float], m: int) -> float:
    """ms of a forward of ``m`` rows from a table of measured Ms: linear between measured Ms, and
    past the largest along its last segment."""
    if not costs:
        raise HarnessError("no forward costs measured")
    if m in costs:
        return float(costs[m])
    ms = sorted(costs)
    if m < ms[0]:
        return float(costs[ms[0]])
    lo = max(x for x in ms if x < m)
    above = [x for x in ms if x > m]
    if above:
        hi = min(above)
    else:
        if len(ms) < 2:
            return float(costs[lo])
        lo, hi = ms[-2], ms[-1]
    slope = (costs[hi] - costs[lo]) / (hi - lo)
    return float(costs[lo] + slope * (m - lo))


def round_ms(tree: Tree, target: Mapping[int, float], draft: Mapping[int, float]) -> float:
    """ms of one round: the draft's forward per level, then the target's verify forward."""
    return sum(cost_at(draft, rows) for rows in tree.draft_rows()) + cost_at(target, tree.verify_rows)


def predicted_speedup(
    tokens_per_round: float, tree: Tree, target: Mapping[int, float], draft: Mapping[int, float]
) -> float:
    """Tokens per round over the round's cost in one-token target forwards (plain decoding's step)."""
    return tokens_per_round * cost_at(target, 1) / round_ms(tree, target, draft)
