"""Candidate trees: what a tree accepts is read off the ranks of the target's tokens in the draft's
predictions, and the chain read that way is what a real assisted decode accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.base.errors import HarnessError
from harness.experiments import trees as tree_runs
from harness.pairs import models
from harness.settings import setup
from harness.theory import trees
from harness.theory.trees import MISS, Tree

ROOT = Path(__file__).resolve().parents[1]


def test_a_chain_is_one_rank_zero_path():
    chain = Tree.chain(3)
    assert chain.nodes == ((0,), (0, 0), (0, 0, 0))
    assert chain.verify_rows == 4 and chain.draft_rows() == [1, 1, 1] and chain.label() == "chain 3"


def test_a_tree_needs_every_nodes_parent():
    with pytest.raises(HarnessError, match="has no parent"):
        Tree.of([(0,), (1, 0)])
    with pytest.raises(HarnessError, match="non-empty path"):
        Tree.of([()])


def test_the_draft_forwards_each_level_of_nodes_with_children():
    tree = Tree.of([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    # The root; then (0,) and (1,) have children; then only (0, 0).
    assert tree.draft_rows() == [1, 2, 1]
    assert tree.verify_rows == 7 and tree.label() == "2-3-1" and tree.depth == 3


@pytest.mark.parametrize(
    ("ranks", "limit", "expected"),
    [
        ([0, 0, 0, 0], 9, 3),  # the whole chain of the tree, then its end
        ([1, 0, 5], 9, 2),  # the second-best token, then its best continuation
        ([0, 1], 9, 1),  # (0, 1) is not in the tree
        ([2, 0], 9, 0),
        ([MISS, 0], 9, 0),
        ([0, 0, 0], 2, 2),  # the budget left caps the candidates
    ],
)
def test_a_round_accepts_the_longest_true_path_in_the_tree(ranks, limit, expected):
    tree = Tree.of([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])
    assert tree.accepted(ranks, limit) == expected


def test_rounds_over_a_decode():
    # 7 tokens; chain of 2: rounds start at 0 (accepts 2: tokens 0-2), 3 (rank 1 at 3: accepts 0),
    # 4 (accepts 1: tokens 4-5), 6 (last token: no candidate left).
    ranks = [0, 0, 0, 1, 0, 2, 0]
    r = trees.simulate(Tree.chain(2), ranks)
    assert (r.rounds, r.accepted, r.tokens) == (4, 3, 7)
    # With the second-best token at the first depth as well, round 2 accepts it and its successor.
    wide = trees.simulate(Tree.of([(0,), (1,), (0, 0), (1, 0)]), ranks)
    assert (wide.rounds, wide.accepted) == (3, 4)
    assert wide.tokens_per_round > r.tokens_per_round


def test_the_grown_tree_holds_the_most_frequent_paths_and_is_prefix_closed():
    ranks = [0, 0, 1, 0, 0, 1, 0, MISS, 0]
    counts = trees.path_counts(ranks, 3)
    assert counts[(0,)] == 6 and counts[(1,)] == 2 and counts[(0, 0)] == 2 and (0, MISS) not in counts
    tree = trees.grow(counts, 3)
    assert tree.nodes == ((0,), (1,), (0, 0)) or tree.nodes == ((0,), (0, 0), (1,))
    for size in range(1, 8):
        grown = trees.grow(counts, size)
        assert all(len(p) == 1 or p[:-1] in grown.nodes for p in grown.nodes)


def test_round_cost_from_the_forward_cost_table():
    target = {1: 10.0, 2: 11.0, 4: 13.0}
    draft = {1: 2.0, 2: 2.5}
    assert trees.cost_at(target, 3) == pytest.approx(12.0)  # between measured Ms
    assert trees.cost_at(target, 6) == pytest.approx(15.0)  # past the largest, along its last segment
    chain = Tree.chain(3)
    assert trees.round_ms(chain, target, draft) == pytest.approx(3 * 2.0 + 13.0)
    assert trees.predicted_speedup(3.0, chain, target, draft) == pytest.approx(3.0 * 10.0 / 19.0)


# --------------------------------------------------------------------------- on a real decode


@pytest.fixture(scope="module")
def exact_pair(pairs):
    # The batch-invariant kernels on both models: the draft's prediction at each row of one forward
    # is its one-token step's, so the ranks are what its proposals were.
    spec = models.get_pair("tiny-llama")
    return pairs.load(spec, setup.resolve(spec, target_kernels="invariant", draft_kernels="invariant"))


@pytest.mark.parametrize("k", [1, 3])
def test_the_chain_read_off_the_ranks_is_what_a_real_chain_decode_accepted(exact_pair, k):
    ids = list(exact_pair.tokenizer("def fibonacci(n):")["input_ids"])
    decoded = tree_runs.decode_prompt(exact_pair, "fib", ids, 24, k)
    assert len(decoded.ranks) == 24 and decoded.chain_accepted > 0
    assert tree_runs.chain_problems([decoded]) == []
    # Ranks that are not the draft's are caught: a draft that never proposes the target's token.
    missed = tree_runs.Decoded(
        "missed", (MISS,) * len(decoded.ranks), k, decoded.chain_rounds, decoded.chain_accepted
    )
    assert tree_runs.chain_problems([missed]) != []


def _trees(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.trees", *argv],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def test_the_planner_keeps_its_ranks_and_plans_again_from_them(tmp_path):
    rows = tmp_path / "trees.jsonl"
    argv = ["--model_name", "tiny-llama", "--kernels", "invariant", "--prompts", "code", "--limit", "2"]
    done = _trees(
        *argv, "--max_new_tokens", "16", "--repetitions", "1", "--json", str(rows), "--measure", "best"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kept = [json.loads(line) for line in rows.read_text().splitlines()]
    kinds = [r["kind"] for r in kept]
    assert kinds[:3] == ["prompt", "prompt", "costs"] and set(kinds[3:]) == {"tree", "measured"}
    # The best chain and the best tree decoded for real: what the ranks predicted, the plain output.
    measured = [r for r in kept if r["kind"] == "measured"]
    assert len(measured) == 4 and len({r["tree"] for r in measured}) == 2
    assert all(r["identical"] and r["rounds"] == r["predicted_rounds"] for r in measured)
    assert all(r["accepted"] == r["predicted_accepted"] for r in measured)
    assert "Rounds as predicted" in done.stdout
    # Its own rows file is taken again by a later run (appended to), a results rows file's check not.
    from harness.settings import results

    results.check_rows_path(rows, keys=tree_runs.ROW_KEYS)
    with pytest.raises(HarnessError, match="not a rows file"):
        results.check_rows_path(rows)
    assert kept[2]["chain_checked"] and sorted(map(int, kept[2]["target_ms"])) == list(range(1, 18))
    assert all(len(r["ranks"]) == 16 for r in kept[:2])
    best = [line for line in done.stdout.splitlines() if line.startswith("best:")]
    assert len(best) == 1 and "chain" in done.stdout
    # The same plan from the kept rows alone, nothing decoded.
    again = _trees("--replan", str(rows))
    assert again.returncode == 0, again.stderr[-2000:]
    assert [line for line in again.stdout.splitlines() if line.startswith("best:")] == best


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--prompts", "code,poems"], "--prompts takes code, general and humaneval"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--replan", "/nonexistent/trees.jsonl"], "not a trees run's rows"),
        (["--measure", "0+x"], "--measure: a tree is rank paths"),
        (["--synthetic_acceptance", "0.5,2"], "--synthetic_acceptance takes probabilities in [0, 1]"),
    ],
)
def test_bad_planner_input_is_one_line(argv, expected):
    done = _trees(*argv)
    assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr


def test_the_planner_times_a_round_against_a_synthetic_acceptance(tmp_path):
    """``--synthetic_acceptance``: a chain whose verdict is a draw, so each round's real cost is
    measured at a chosen acceptance: at p = 0 one token a round, at p = 1 K + 1, each row kept."""
    rows = tmp_path / "trees.jsonl"
    argv = ["--model_name", "tiny-llama", "--kernels", "invariant", "--prompts", "code", "--limit", "2"]
    argv += ["--max_new_tokens", "24", "--repetitions", "1", "--num_assistant_tokens", "3"]
    done = _trees(*argv, "--synthetic_acceptance", "0,0.5,1", "--json", str(rows))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "synthetic acceptance, a chain of K=3" in done.stdout
    kept = {r["p"]: r for r in map(json.loads, rows.read_text().splitlines()) if r["kind"] == "synthetic"}
    assert sorted(kept) == [0.0, 0.5, 1.0]
    # The prompt's forward verifies the first round: the rest of each 24-token decode is timed.
    assert kept[0.0]["tokens"] == kept[0.0]["rounds"] == 2 * 23  # one token a round
    assert kept[1.0]["tokens"] == 4 * kept[1.0]["rounds"] == 2 * 20  # K + 1 a round
    assert kept[1.0]["expected_tokens_per_round"] == 4.0 and kept[0.0]["expected_tokens_per_round"] == 1.0
    assert all(r["decode_ms"] > 0 and r["predicted_round_ms"] > 0 for r in kept.values())
