"""What candidate trees would give on a pair, measured before a tree verifier exists.

For each prompt: the target's plain greedy output (the tokens any exact assisted decoding must
emit), then one forward of the draft over the prompt and that output, which gives the rank of each
output token in the draft's prediction after the true prefix (``theory.trees``: any tree's
acceptance is read off these ranks). Beside them, in the same run: one real assisted decode with a
chain of K (constant schedule), whose accepted count and rounds the chain read off the ranks must
equal (the check that the table is what decoding sees), and the forward-cost table of both models
for M = 1..16 rows, from which each tree's round cost and speedup are predicted.

``python -m harness.trees`` prints, per tree size, the tree that accepts most on these prompts, its
tokens per round, round cost and predicted speedup over plain decoding, against the chain's.
"""

from __future__ import annotations

import math
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from harness.base.errors import HarnessError
from harness.decoding import engines
from harness.decoding.generation import generate
from harness.experiments.forwards import time_forwards
from harness.experiments.runner import prompt_ids
from harness.pairs import models
from harness.pairs.models import LoadedPair
from harness.settings import setup
from harness.settings.setup import GenerationSettings
from harness.theory import trees

# What every row this tool keeps holds (prompts, costs, plans, measurements): an earlier run's file
# is appended to, any other refused.
ROW_KEYS = ("pair", "platform", "kind", "command")
# Ranks past this many count as misses: a tree of at most 16 nodes never holds a deeper one.
RANKS = 8
MAX_NODES = 16


@dataclass(frozen=True)
class Decoded:
    """One prompt: the ranks of the target's plain output in the draft's predictions, and what a
    real chain decode of K accepted."""

    label: str
    ranks: tuple[int, ...]
    chain_k: int
    chain_rounds: int
    chain_accepted: int


def output_ranks(
    draft: torch.nn.Module, prompt: Sequence[int], output: Sequence[int], ranks: int = RANKS
) -> list[int]:
    """Each output token's rank in the draft's prediction after the prompt and the output before
    it (``trees.MISS`` past ``ranks``), from one forward over the prompt and the output. Rank 0 is
    the argmax, as the draft's greedy proposal takes it."""
    from transformers import DynamicCache

    if not prompt or not output:
        return []
    ids = torch.tensor([[*prompt, *output[:-1]]], dtype=torch.long, device=draft.device)
    with torch.inference_mode():
        logits = draft(ids, past_key_values=DynamicCache(), use_cache=True).logits[0, len(prompt) - 1 :]
    top = torch.topk(logits.float(), ranks, dim=-1).indices
    top[:, 0] = logits.argmax(dim=-1)  # ties: the token greedy decoding takes is rank 0
    found = []
    for row, token in zip(top.tolist(), output, strict=True):
        found.append(row.index(int(token)) if int(token) in row else trees.MISS)
    return found


def decode_prompt(pair: LoadedPair, label: str, ids: list[int], new_tokens: int, k: int) -> Decoded:
    """The plain output's ranks, and a real chain-of-K decode's rounds and accepted candidates."""
    plain = generate(pair, ids, GenerationSettings(max_new_tokens=new_tokens, ignore_eos=True))
    chain = generate(
        pair,
        ids,
        GenerationSettings(
            mode="assisted",
            num_assistant_tokens=k,
            assistant_schedule="constant",
            max_new_tokens=new_tokens,
            ignore_eos=True,
        ),
    )
    if chain.output_ids != plain.output_ids:
        raise HarnessError(
            f"{label}: the assisted output differs from plain; trees are planned on exact decoding only "
            "(the pair's registered kernels)"
        )
    return Decoded(
        label,
        tuple(output_ranks(pair.draft, ids, plain.output_ids)),
        k,
        chain.target_forwards,
        chain.accepted,
    )


@dataclass(frozen=True)
class Plan:
    """One tree on the measured prompts: what it accepts and what a round of it costs."""

    label: str
    size: int
    depth: int
    verify_rows: int
    tokens_per_round: float
    round_ms: float
    predicted_speedup: float
    nodes: tuple[trees.Path, ...]

    @property
    def spec(self) -> str:
        """The tree's ``--draft_tree`` spelling (its ranks stay below ``RANKS``, one digit each)."""
        return trees.Tree.of(self.nodes).spec()


def plan(
    decoded: Sequence[Decoded],
    target_ms: dict[int, float],
    draft_ms: dict[int, float],
    max_nodes: int = MAX_NODES,
    chains: Sequence[int] = (1, 2, 3, 4, 5, 6),
) -> list[Plan]:
    """The chains and, per size, the tree that accepts most on these prompts, each simulated over
    every prompt's rounds and costed from the forward-cost table."""
    counts: Counter[trees.Path] = Counter()
    for d in decoded:
        counts.update(trees.path_counts(d.ranks, max_nodes))
    shapes = [trees.Tree.chain(k) for k in chains]
    # Grown by frequency alone, a tree is a chain until it is very long (a deep rank-0 path is more
    # frequent than a second-best token); each depth is a draft forward, a wider level only more
    # verify rows. So trees are grown within each depth limit, and the costs pick among them.
    for depth in range(1, max(chains) + 1):
        within = Counter({p: n for p, n in counts.items() if len(p) <= depth})
        shapes += [trees.grow(within, n) for n in range(1, max_nodes + 1)]
    plans, seen = [], set()
    for tree in shapes:
        if not tree.nodes or tree.nodes in seen:
            continue
        seen.add(tree.nodes)
        rounds = [trees.simulate(tree, d.ranks) for d in decoded]
        tpr = sum(r.tokens for r in rounds) / max(1, sum(r.rounds for r in rounds))
        plans.append(
            Plan(
                tree.label(),
                tree.size,
                tree.depth,
                tree.verify_rows,
                tpr,
                trees.round_ms(tree, target_ms, draft_ms),
                trees.predicted_speedup(tpr, tree, target_ms, draft_ms),
                tree.nodes,
            )
        )
    return plans


@dataclass(frozen=True)
class Measured:
    """One tree decoded for real on one prompt (``harness.decoding.trees``), beside the prompt's plain
    decode in the same minute: what it accepted against what the ranks predict, and its time."""

    label: str
    tree: str  # the tree's spelling (``--draft_tree``)
    rounds: int
    accepted: int
    predicted_rounds: int
    predicted_accepted: int
    tokens: int
    seconds: float
    plain_seconds: float
    identical: bool


def measure(
    pair: LoadedPair,
    prompts: Sequence[tuple[str, list[int]]],
    decoded: Sequence[Decoded],
    specs: Sequence[str],
    new_tokens: int,
) -> list[Measured]:
    """Each tree of ``specs`` decoded on each prompt beside a plain decode, their order rotated from
    prompt to prompt (hosts drift within minutes)."""
    out = []
    for i, ((label, ids), d) in enumerate(zip(prompts, decoded, strict=True)):
        arms = ["", *specs]
        arms = arms[i % len(arms) :] + arms[: i % len(arms)]
        runs = {}
        for spec in arms:
            mode = "assisted" if spec else "plain"
            settings = GenerationSettings(
                mode=mode, max_new_tokens=new_tokens, ignore_eos=True, draft_tree=spec
            )
            runs[spec] = generate(pair, ids, settings)
        plain = runs[""]
        for spec in specs:
            m, sim = runs[spec], trees.simulate(trees.Tree.parse(spec), d.ranks)
            out.append(
                Measured(
                    label, spec, m.target_forwards, m.accepted, sim.rounds, sim.accepted, m.new_tokens,
                    m.total_s, plain.total_s, m.output_ids == plain.output_ids,
                )
            )  # fmt: skip
    return out


def measured_table(measured: Sequence[Measured], plans: Sequence[Plan]) -> str:
    """Per tree: tokens a round measured against the ranks' prediction, and speed against plain."""
    from tabulate import tabulate

    predicted = {p.spec: p for p in plans}
    body = []
    for spec in dict.fromkeys(m.tree for m in measured):
        ms = [m for m in measured if m.tree == spec]
        tokens, rounds = sum(m.tokens for m in ms), sum(m.rounds for m in ms)
        plan = predicted.get(spec)
        body.append(
            [
                trees.Tree.parse(spec).label(),
                spec,
                f"{tokens / rounds:.2f}",
                f"{tokens / sum(m.predicted_rounds for m in ms):.2f}",
                "yes" if all((m.rounds, m.accepted) == (m.predicted_rounds, m.predicted_accepted) for m in ms)
                else "no",
                f"{sum(m.plain_seconds for m in ms) / sum(m.seconds for m in ms):.2f}x",
                f"{plan.predicted_speedup:.2f}x" if plan else "-",
                "yes" if all(m.identical for m in ms) else "NO",
            ]
        )  # fmt: skip
    headers = ["Tree", "--draft_tree", "Tokens/round", "Predicted", "Rounds as predicted", "Speedup",
               "Predicted speedup", "Identical"]  # fmt: skip
    return tabulate(body, headers=headers, tablefmt="github")


def chain_problems(decoded: Sequence[Decoded]) -> list[str]:
    """Where the chain read off the ranks disagrees with the real chain decode (empty: nowhere)."""
    problems = []
    for d in decoded:
        sim = trees.simulate(trees.Tree.chain(d.chain_k), d.ranks)
        # A round is one verify forward of the target; the real run's first is also its prefill.
        if (sim.rounds, sim.accepted) != (d.chain_rounds, d.chain_accepted):
            problems.append(
                f"{d.label}: ranks give {sim.rounds} rounds accepting {sim.accepted}, the real chain of "
                f"{d.chain_k} ran {d.chain_rounds} accepting {d.chain_accepted}"
            )
    return problems


@dataclass(frozen=True)
class Synthetic:
    """A chain of K decoded with a synthetic verdict at acceptance ``p``, over the prompts: what a
    round cost at that acceptance, beside what the forward-cost table predicts it costs."""

    p: float
    k: int
    tokens: int
    rounds: int
    decode_ms: float  # wall ms after each prompt's forward (which verified the first round), summed
    expected_tokens_per_round: float  # (1 - p^(K+1)) / (1 - p): a chain's, accepted at rate p
    predicted_round_ms: float  # K draft forwards and the K+1-row verification, from the table

    @property
    def round_ms(self) -> float:
        return self.decode_ms / self.rounds if self.rounds else math.nan


def synthetic_rounds(
    pair: LoadedPair,
    prompts: Sequence[tuple[str, list[int]]],
    ps: Sequence[float],
    k: int,
    new_tokens: int,
    target_ms: dict[int, float],
    draft_ms: dict[int, float],
) -> list[Synthetic]:
    """Per acceptance p, every prompt decoded with a chain of K whose verdict is a draw accepting each
    proposal with probability p (``--synthetic_acceptance``): a round's real cost against
    acceptance, the draft's quality set aside."""
    out = []
    chain = trees.Tree.chain(k)
    for p in ps:
        settings = GenerationSettings(
            mode="assisted", max_new_tokens=new_tokens, ignore_eos=True, num_assistant_tokens=k,
            synthetic_acceptance=p,
        )  # fmt: skip
        tokens = rounds = 0
        decode_ms = 0.0
        for _, ids in prompts:
            m = generate(pair, ids, settings)
            # The prompt's forward verifies the first round (its cost is the prefill's): left out.
            first = sum((m.judged_steps or [[]])[0]) + 1
            tokens += m.new_tokens - first
            rounds += m.target_forwards - 1
            decode_ms += m.total_s * 1000 - m.prefill_ms
        expected = (1 - p ** (k + 1)) / (1 - p) if p < 1 else float(k + 1)
        out.append(
            Synthetic(p, k, tokens, rounds, decode_ms, expected, trees.round_ms(chain, target_ms, draft_ms))
        )
    return out


def synthetic_table(rows: Sequence[Synthetic], one_step_ms: float) -> str:
    """Per acceptance: tokens and ms a round measured against the table's prediction, and time per
    token against plain decoding's one-token step."""
    from tabulate import tabulate

    body = [
        [
            f"{r.p:g}",
            f"{r.tokens / r.rounds:.2f}" if r.rounds else "-",
            f"{r.expected_tokens_per_round:.2f}",
            f"{r.round_ms:.1f}",
            f"{r.predicted_round_ms:.1f}",
            f"{one_step_ms * r.tokens / r.decode_ms:.2f}x" if r.decode_ms else "-",
        ]
        for r in rows
    ]
    headers = ["p", "tokens/round", "expected", "ms/round", "predicted ms/round", "speed vs one-token step"]
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def forward_costs(
    pair: LoadedPair, rows: Sequence[int] = tuple(range(1, MAX_NODES + 2)), repetitions: int = 5
) -> tuple[dict[int, float], dict[int, float]]:
    """Median ms of one forward of M rows, target and draft (the draft's widest level is at most
    ``MAX_NODES`` rows), timed in the run that decoded the prompts: hosts drift between runs."""
    target = {m: t.median for m, t in time_forwards(pair.target, rows, repetitions=repetitions).items()}
    widths = [m for m in rows if m <= MAX_NODES]
    draft = {m: t.median for m, t in time_forwards(pair.draft, widths, repetitions=repetitions).items()}
    return target, draft


def table(plans: Sequence[Plan], best_chain: Plan) -> str:
    from tabulate import tabulate

    body = [
        [
            p.label,
            p.spec,
            p.size,
            p.verify_rows,
            f"{p.tokens_per_round:.2f}",
            f"{p.round_ms:.1f}",
            f"{p.predicted_speedup:.2f}x",
            f"{p.predicted_speedup / best_chain.predicted_speedup:.3f}",
        ]
        for p in plans
    ]
    headers = ["Tree", "--draft_tree", "Nodes", "Verify rows", "Tokens/round", "Round ms", "Predicted"]
    headers.append("vs best chain")
    return tabulate(body, headers=headers, tablefmt="github")


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.trees``: which candidate tree would pay on this pair and host."""
    import argparse

    from tqdm import tqdm

    from harness.base import platforms, tasks
    from harness.experiments import humaneval
    from harness.settings import results

    parser = argparse.ArgumentParser(prog="python -m harness.trees", description=main.__doc__)
    parser.add_argument("--model_name", default=models.DEFAULT_PAIR, help="registered pair")
    parser.add_argument(
        "--prompts",
        default="code,humaneval",
        help="comma-separated: code, general (the decode task's prompts), humaneval",
    )
    parser.add_argument("--limit", type=int, default=4, help="how many prompts of each kind")
    parser.add_argument("--max_new_tokens", type=int, default=96, help="tokens per decode")
    parser.add_argument("--num_assistant_tokens", type=int, default=3, help="K of the real chain decode")
    parser.add_argument(
        "--kernels",
        choices=("invariant",),
        default=None,
        help="run both models on the batch-invariant kernels (default: the pair's registered ones)",
    )
    parser.add_argument("--repetitions", type=int, default=5, help="timed forwards per M (median)")
    parser.add_argument("--weights_dir", default=None, help="directory holding the weights (see README)")
    parser.add_argument(
        "--json",
        default=None,
        help="also append each prompt's ranks and each tree's plan as JSON rows here",
    )
    parser.add_argument(
        "--measure",
        default=None,
        metavar="TREES",
        help="comma-separated trees (--draft_tree spellings) to decode for real on the same prompts "
        "beside plain decoding, after the plan; 'best': the chain and the tree predicted fastest",
    )
    parser.add_argument(
        "--synthetic_acceptance",
        default=None,
        metavar="P[,P]",
        help="after the plan, decode the prompts with a chain of --num_assistant_tokens whose verdict "
        "accepts each proposal with probability P: each round's real cost against acceptance, beside "
        "the forward-cost table's prediction",
    )
    parser.add_argument(
        "--replan",
        default=None,
        metavar="FILE",
        help="plan again from a run's --json rows (its ranks and forward costs), decoding nothing",
    )
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    for name in ("limit", "max_new_tokens", "num_assistant_tokens", "repetitions"):
        if getattr(args, name) < 1:
            parser.exit(2, f"error: --{name} must be at least 1\n")
    if args.measure and args.measure.strip() != "best":
        try:
            _measured_specs(args.measure, [])
        except HarnessError as exc:
            parser.exit(2, f"error: --measure: {exc}\n")
    synthetic_ps: list[float] = []
    if args.synthetic_acceptance:
        try:
            synthetic_ps = [float(x) for x in args.synthetic_acceptance.split(",") if x.strip()]
        except ValueError:
            synthetic_ps = [math.nan]
        if not synthetic_ps or not all(0.0 <= x <= 1.0 for x in synthetic_ps):
            parser.exit(
                2,
                f"error: --synthetic_acceptance takes probabilities in [0, 1], not "
                f"{args.synthetic_acceptance!r}\n",
            )
    kinds = [k.strip() for k in args.prompts.split(",") if k.strip()]
    unknown = sorted(set(kinds) - {"code", "general", "humaneval"})
    if unknown or not kinds:
        parser.exit(2, f"error: --prompts takes code, general and humaneval, not {args.prompts!r}\n")
    if args.replan:
        try:
            decoded, target_ms, draft_ms, context = read_run(args.replan)
        except HarnessError as exc:
            parser.exit(2, f"error: {exc}\n")
        report(decoded, target_ms, draft_ms, f"{context['pair']} on {context['platform']} ({args.replan})")
        return 0
    try:
        spec = models.get_pair(args.model_name)
        if args.json:
            results.check_rows_path(Path(args.json), keys=ROW_KEYS)
        models.offline_env()
        given_kernels = (
            {"target_kernels": args.kernels, "draft_kernels": args.kernels} if args.kernels else {}
        )
        run = setup.resolve(spec, **given_kernels)
        pair = engines.load(spec, run, weights_dir=args.weights_dir)
        if pair.target is None or pair.draft is None:
            raise HarnessError(
                f"{spec.name}: trees are planned on the harness's own decoding with a draft model"
            )
        chosen = []
        for kind in kinds:
            if kind == "humaneval":
                chosen += humaneval.prompts(args.limit, args.max_new_tokens, pair.tokenizer)
            else:
                chosen += tasks.decode_prompts(kind)[: args.limit]
        prompts = [(p.label, prompt_ids(pair, p)) for p in chosen]
        info = platforms.detect()
        context = {
            "pair": spec.name,
            "platform": info.name,
            "prompts": args.prompts,
            "limit": args.limit,
            "max_new_tokens": args.max_new_tokens,
            "threads": torch.get_num_threads(),
            "versions": platforms.library_versions(),
            "command": shlex.join(["python", "-m", "harness.trees", *given]),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        decoded = []
        for label, ids in tqdm(prompts, desc="prompts", unit="prompt"):
            decoded.append(decode_prompt(pair, label, ids, args.max_new_tokens, args.num_assistant_tokens))
            if args.json:  # each prompt kept as it finishes
                results.append_row(args.json, {**context, "kind": "prompt", **asdict(decoded[-1])})
        print(f"timing forwards of 1..{MAX_NODES + 1} rows, target and draft ...", file=sys.stderr)
        target_ms, draft_ms = forward_costs(pair, repetitions=args.repetitions)
    except HarnessError as exc:
        parser.exit(2, f"error: {exc}\n")
    problems = chain_problems(decoded)
    plans = report(decoded, target_ms, draft_ms, f"{spec.name} on {info.name}")
    if problems:
        print("the ranks disagree with the real chain decode:\n  " + "\n  ".join(problems), file=sys.stderr)
    measured: list[Measured] = []
    if args.measure:
        specs = _measured_specs(args.measure, plans)
        try:
            measured = measure(pair, prompts, decoded, specs, args.max_new_tokens)
        except HarnessError as exc:
            parser.exit(2, f"error: {exc}\n")
        print("measured, each beside plain decoding of the same prompts:")
        print(measured_table(measured, plans))
        problems += [
            f"{m.label}: tree {m.tree} output differs from plain" for m in measured if not m.identical
        ]
    if synthetic_ps:
        try:
            synthetic = synthetic_rounds(
                pair,
                prompts,
                synthetic_ps,
                args.num_assistant_tokens,
                args.max_new_tokens,
                target_ms,
                draft_ms,
            )
        except HarnessError as exc:
            parser.exit(2, f"error: {exc}\n")
        print(f"synthetic acceptance, a chain of K={args.num_assistant_tokens} (outputs not the target's):")
        print(synthetic_table(synthetic, trees.cost_at(target_ms, 1)))
        if args.json:
            for r in synthetic:
                results.append_row(args.json, {**context, "kind": "synthetic", **asdict(r)})
    if args.json:
        costs = {
            **context,
            "kind": "costs",
            "chain_checked": not problems,
            "target_ms": {str(m): v for m, v in target_ms.items()},
            "draft_ms": {str(m): v for m, v in draft_ms.items()},
        }
        results.append_row(args.json, costs)
        for p in plans:
            results.append_row(args.json, {**context, "kind": "tree", **asdict(p)})
        for m in measured:
            results.append_row(args.json, {**context, "kind": "measured", **asdict(m)})
    return 1 if problems else 0


def _measured_specs(given: str, plans: Sequence[Plan]) -> list[str]:
    if given.strip() != "best":
        specs = [w.strip() for w in given.split(",") if w.strip()]
        for spec in specs:
            trees.Tree.parse(spec)
        return specs
    chains = [p for p in plans if p.label.startswith("chain")]
    others = [p for p in plans if p not in chains]
    best = [max(chains, key=lambda p: p.predicted_speedup)]
    if others:
        best.append(max(others, key=lambda p: p.predicted_speedup))
    return [p.spec for p in best]


def report(
    decoded: Sequence[Decoded], target_ms: dict[int, float], draft_ms: dict[int, float], title: str
) -> list[Plan]:
    """Print the plan: costs, the chains, per size the tree predicted fastest, and the best."""
    plans = plan(decoded, target_ms, draft_ms)
    chains = [p for p in plans if p.label.startswith("chain")]
    best_chain = max(chains, key=lambda p: p.predicted_speedup)
    best_of_size: dict[int, Plan] = {}
    for p in plans:
        if p not in chains and (
            p.size not in best_of_size or p.predicted_speedup > best_of_size[p.size].predicted_speedup
        ):
            best_of_size[p.size] = p
    tokens = sum(len(d.ranks) for d in decoded)
    print(
        f"{title}: {len(decoded)} prompts, {tokens} tokens; target {target_ms[1]:.1f} ms a token, "
        f"draft {draft_ms[1]:.1f} ms (c {draft_ms[1] / target_ms[1]:.2f})"
    )
    print("verify forward by rows (x one row): " + ", ".join(
        f"{m}: {target_ms[m] / target_ms[1]:.2f}" for m in sorted(target_ms)
    ))  # fmt: skip
    print("the chains, then per size the tree predicted fastest:")
    print(table(chains + [best_of_size[n] for n in sorted(best_of_size)], best_chain))
    best = max(plans, key=lambda p: p.predicted_speedup)
    print(
        f"best: {best.label} ({best.size} nodes, {best.tokens_per_round:.2f} tokens a round) "
        f"{best.predicted_speedup:.2f}x predicted, against the best chain's "
        f"{best_chain.predicted_speedup:.2f}x ({best_chain.label})"
    )
    return plans


def read_run(path: str) -> tuple[list[Decoded], dict[int, float], dict[int, float], dict]:
    """A run's prompts (their ranks) and forward costs from its ``--json`` rows."""
    import json

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        raise HarnessError(f"--replan {path}: not a trees run's rows ({exc})") from None
    costs = [r for r in rows if isinstance(r, dict) and r.get("kind") == "costs"]
    if not costs:
        raise HarnessError(
            f"--replan {path}: no finished run (its forward costs) in it; write one with --json"
        )
    last = costs[-1]  # the last finished run, and its prompts
    run = [r for r in rows if r.get("kind") == "prompt" and r.get("timestamp") == last.get("timestamp")]
    try:
        decoded = [
            Decoded(r["label"], tuple(int(x) for x in r["ranks"]), int(r["chain_k"]),
                    int(r["chain_rounds"]), int(r["chain_accepted"]))
            for r in run
        ]  # fmt: skip
        target = {int(m): float(v) for m, v in last["target_ms"].items()}
        draft = {int(m): float(v) for m, v in last["draft_ms"].items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise HarnessError(f"--replan {path}: a prompt row lacks {exc}") from None
    return decoded, target, draft, last
