"""Token-tree decoding (``--draft_tree``): each verified row is the one-token step on its path, so the
output is the target's own greedy output; the oracles that prove the tree was exercised; and the
settings that refuse what it cannot run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import load_pair
from test_cli import TINY, read_json_rows, run_cli

from harness.base.errors import HarnessError
from harness.decoding import strategies, trees
from harness.decoding.generation import generate
from harness.kernels import fused, invariant
from harness.settings import setup
from harness.settings.setup import GenerationSettings
from harness.theory.trees import Tree

# A chain, a second choice at the first depth, a wide and deep tree, a bushy one.
TREES = ("0+00+000", "0+1+00+000", "0+1+2+00+10+000+0000", "0+1+00+01+10+11+000")
PROMPTS = (list(range(3, 30)), [7, 7, 7, 19, 4, 4, 100, 3], list(range(200, 260, 3)))
NEW = 32


def _pair(name: str, precision: str):
    return load_pair(
        name,
        target_precision=precision,
        target_kernels="invariant",
        draft_precision=precision,
        draft_kernels="invariant",
    )


@pytest.fixture(
    scope="module", params=[("tiny-qwen2", "w8af32"), ("tiny-llama", "q4k")], ids=lambda p: "-".join(p)
)
def pair(request):
    """A fused pair on each path of the fused layer: the per-step calls (w8af32) and the two C++
    calls of a layer on k-quant blocks (q4k)."""
    return _pair(*request.param)


def _tree(spec: str, new: int = NEW, **kw) -> GenerationSettings:
    return GenerationSettings(mode="assisted", max_new_tokens=new, ignore_eos=True, draft_tree=spec, **kw)


def _plain(new: int = NEW, **kw) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=new, ignore_eos=True, **kw)


def test_a_tree_row_attends_exactly_as_the_step_on_its_path():
    """The attention kernel with a tree mask: a node's row has the bits of a one-token step onto a
    cache holding the prefix and its path only (keys skipped, not weighted by zero)."""
    ext = invariant.extension()
    torch.manual_seed(0)
    heads, kv_heads, dim, prefix = 4, 2, 16, 11
    nodes = Tree.parse("0+1+00+01+10+000").nodes
    rows = [(), *nodes]
    n = len(rows)
    q = torch.randn(n, heads * dim)
    k = torch.randn(kv_heads, prefix + n, dim)
    v = torch.randn(kv_heads, prefix + n, dim)
    mask = trees.tree_mask(tuple(rows), tuple(rows))
    tree = ext.attention_md(q, k, v, heads, 0.25, mask)
    for i, node in enumerate(rows):
        path = [j for j, entry in enumerate(rows) if node[: len(entry)] == entry]
        keep = list(range(prefix)) + [prefix + j for j in path]
        step = ext.attention_md(q[i : i + 1], k[:, keep], v[:, keep], heads, 0.25)
        assert torch.equal(tree[i], step[0]), node
    causal = ext.attention_md(q, k, v, heads, 0.25)
    assert not torch.equal(tree, causal)  # the mask did change the rows that have siblings before them


@pytest.mark.parametrize("pending", [1, 3, 20])
def test_a_mask_of_the_nodes_rows_alone_keeps_the_rows_before_it_causal(pending):
    """A round's mask covers only its nodes (``verify_mask``): the pending rows before them (a first
    round's prompt; past SHARED_ROWS rows the kernel's other path) get the bits of a causal forward,
    and the nodes those of a mask over every row."""
    ext = invariant.extension()
    torch.manual_seed(1)
    heads, kv_heads, dim, prefix = 4, 2, 16, 9
    nodes = Tree.parse("0+1+00+01+10+000").nodes
    m = pending + len(nodes)
    q = torch.randn(m, heads * dim)
    k = torch.randn(kv_heads, prefix + m, dim)
    v = torch.randn(kv_heads, prefix + m, dim)
    full = torch.zeros(m, m, dtype=torch.bool)
    full[:pending, :pending] = torch.ones(pending, pending, dtype=torch.bool).tril()
    full[pending:, :pending] = True
    full[pending:, pending:] = trees.tree_mask(nodes, nodes)
    ours = ext.attention_md(q, k, v, heads, 0.25, trees.verify_mask(nodes))
    assert torch.equal(ours, ext.attention_md(q, k, v, heads, 0.25, full))
    assert torch.equal(ours[:pending], ext.attention_md(q, k, v, heads, 0.25)[:pending])


def test_a_chains_mask_runs_unmasked_with_the_same_bits(pair):
    """A chain's mask is causal attention's, so the forward runs without it; the masked path gives the
    same logits, and a tree's mask is kept."""
    chain = ((0,), (0, 0), (0, 0, 0))
    assert trees._causal(trees.verify_mask(chain)) and trees._causal(trees.tree_mask(((0, 0),), chain[:2]))
    assert not trees._causal(trees.verify_mask(((0,), (1,), (0, 0))))
    prompt, tokens = PROMPTS[0], [41, 42, 43, 44]
    logits = {}
    for masked in (True, False):
        cache = trees.DynamicCache()
        with torch.inference_mode():
            trees._forward(pair.target, prompt, cache, range(len(prompt)), None, keep=1)
            logits[masked] = pair.target(
                input_ids=torch.tensor([tokens]),
                position_ids=torch.tensor([list(range(len(prompt), len(prompt) + 4))]),
                past_key_values=cache,
                use_cache=True,
                tree_mask=trees.verify_mask(chain) if masked else None,
            ).logits
    assert torch.equal(logits[True], logits[False])


def test_the_attention_mask_is_checked():
    ext = invariant.extension()
    q, k = torch.randn(2, 8), torch.randn(1, 5, 8)
    with pytest.raises(RuntimeError, match="must see its own entry"):
        ext.attention_md(q, k, k, 1, 1.0, torch.tensor([[1, 0], [1, 0]], dtype=torch.bool))
    with pytest.raises(RuntimeError, match="R <= T"):
        ext.attention_md(q, k, k, 1, 1.0, torch.ones(2, 1, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="R <= M"):
        ext.attention_md(q, k, k, 1, 1.0, torch.ones(3, 3, dtype=torch.bool))


@pytest.mark.parametrize("spec", TREES)
def test_tree_output_is_the_targets_greedy_output(pair, spec):
    tree = Tree.parse(spec)
    for prompt in PROMPTS:
        plain = generate(pair, prompt, _plain())
        m = generate(pair, prompt, _tree(spec))
        assert m.output_ids == plain.output_ids, (spec, prompt)
        assert m.drafted > 0 and m.accepted > 0
        # One target forward a round, the first verifying the prompt too; a draft forward per level.
        assert m.target_forwards < NEW
        assert m.draft_forwards <= m.target_forwards * tree.depth
        assert m.prompt_tokens == len(prompt) and m.new_tokens == NEW


def test_the_rounds_are_what_the_draft_ranks_predict(pair):
    """Accepted nodes and rounds equal what ``theory.trees.simulate`` reads off the draft's ranks of
    the plain output: the planner's model is what the loop does."""
    from harness.experiments.trees import output_ranks
    from harness.theory.trees import simulate

    for spec in TREES:
        for prompt in PROMPTS:
            plain = generate(pair, prompt, _plain())
            m = generate(pair, prompt, _tree(spec))
            sim = simulate(Tree.parse(spec), output_ranks(pair.draft, prompt, plain.output_ids))
            assert (m.target_forwards, m.accepted) == (sim.rounds, sim.accepted), (spec, prompt)


def test_the_target_as_its_own_draft_accepts_every_first_choice(pair):
    """Every round accepts the tree's whole rank-0 path and no sibling."""
    same = strategies.SameModel().draft(pair)
    spec = "0+1+00+10+000"
    depth = Tree.parse(spec).depth
    for prompt in PROMPTS:
        m = generate(same, prompt, _tree(spec))
        assert m.output_ids == generate(pair, prompt, _plain()).output_ids
        assert m.target_forwards == math.ceil(NEW / (depth + 1))
        assert m.accepted == NEW - m.target_forwards


def test_a_random_draft_is_accepted_by_chance_only(pair):
    strategy = strategies.RandomModel()
    random = strategy.draft(pair)
    # Fresh random weights come on the stock layers; the tree runs on fused ones (a draft's kernels
    # change its proposals only).
    draft = invariant.apply_precision(random.draft, "w8af32")
    fused.fuse(draft)
    random = dataclasses.replace(random, draft=draft)
    drafted = accepted = 0
    for prompt in PROMPTS:
        m = generate(random, prompt, _tree("0+1+2+00"))
        assert m.output_ids == generate(pair, prompt, _plain()).output_ids
        drafted, accepted = drafted + m.drafted, accepted + m.accepted
    assert strategy.acceptance_problem(drafted, accepted, 512, True) is None


def test_a_verifier_whose_nodes_see_their_siblings_is_caught(pair, monkeypatch):
    """Break the tree mask (every row causal over all rows, so a node attends to the siblings stored
    before it): the equality oracle must see the outputs change."""

    def causal_over_all(nodes):
        return torch.ones(len(nodes), len(nodes), dtype=torch.bool).tril() if nodes else None

    monkeypatch.setattr(trees, "verify_mask", causal_over_all)
    spec = "0+1+2+00+10+000+0000"
    differ = [
        generate(pair, p, _tree(spec)).output_ids != generate(pair, p, _plain()).output_ids for p in PROMPTS
    ]
    assert any(differ)


def test_eos_and_stop_strings_end_a_tree_decode_where_plain_decoding_ends(pair):
    prompt = PROMPTS[0]
    full = generate(pair, prompt, _plain()).output_ids
    eos = full[9]
    stop = next(t for i in range(8, NEW) if (t := pair.tokenizer.decode(full[i : i + 2])).strip())
    floor = dict(ignore_eos=False, eos_token_id=full[3], min_new_tokens=8)  # EOS held back until 8
    for settings in (dict(ignore_eos=False, eos_token_id=eos), dict(stop_strings=(stop,)), floor):
        plain = generate(pair, prompt, GenerationSettings(max_new_tokens=NEW, **settings))
        tree = generate(
            pair,
            prompt,
            GenerationSettings(mode="assisted", max_new_tokens=NEW, draft_tree="0+1+00+000", **settings),
        )
        if "min_new_tokens" in settings:
            assert len(plain.output_ids) >= 8  # EOS held back until the floor
        else:
            assert len(plain.output_ids) < NEW
        assert tree.output_ids[: len(plain.output_ids)] == plain.output_ids
        if "eos_token_id" in settings:
            assert tree.output_ids == plain.output_ids


def test_a_budget_shorter_than_the_tree_is_kept():
    pair = _pair("tiny-qwen2", "w8af32")
    prompt = PROMPTS[0]
    for new in (1, 2, 3):
        m = generate(pair, prompt, _tree("0+00+000+0000", new=new))
        assert m.output_ids == generate(pair, prompt, _plain(new=new)).output_ids


@pytest.mark.parametrize(
    ("spec", "message"),
    [("", "joined by +"), ("0+a", "joined by +"), ("0,1", "joined by +"), ("1+10+00", "no parent")],
)
def test_a_bad_tree_is_named(spec, message):
    with pytest.raises(HarnessError, match=message):
        Tree.parse(spec)


def test_tree_spelling_round_trips():
    for spec in TREES:
        assert Tree.parse(spec).spec() == spec
    assert Tree.parse("000+0+00").spec() == "0+00+000"


def test_a_tree_off_the_invariant_kernels_or_sampled_or_in_another_engine_is_refused():
    with pytest.raises(HarnessError, match="decodes greedily"):
        GenerationSettings(mode="assisted", do_sample=True, draft_tree="0+1").validate()
    spec = "tiny-llama"
    from harness.decoding import engines
    from harness.pairs import models

    stock = setup.resolve(models.get_pair(spec), decoding=_tree("0+1"))
    with pytest.raises(HarnessError, match="batch-invariant kernels only"):
        engines.check(spec, stock)
    with pytest.raises(HarnessError, match="own loop"):
        engines.resolve(models.get_pair(spec), engine="llama.cpp", decoding=_tree("0+1"))


def test_a_tree_from_the_command_line_reaches_rows_and_reproduce_command(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    flags = ["--target_kernels", "invariant", "--draft_kernels", "invariant", "--target_precision", "w8af32"]
    flags += ["--draft_precision", "w8af32", "--draft_tree", "0+1+00"]
    code, out, err = run_cli(capsys, *TINY, "--compare", *flags, "--json", str(path))
    assert code == 0, err
    rows = read_json_rows(path)
    assert {r["draft_tree"] for r in rows if r["mode"] == "assisted"} == {"0+1+00"}
    assert {r["draft_tree"] for r in rows if r["mode"] == "plain"} == {None}
    by_mode = {(r["example"], r["mode"]): r["output_ids"] for r in rows}
    assert all(by_mode[(e, "plain")] == by_mode[(e, "assisted")] for e in (1, 2))
    assert "--draft_tree 0+1+00" in out
    code, _, err = run_cli(capsys, *TINY, "--assisted_generation", "--draft_tree", "0+x")
    assert code == 2 and "joined by +" in err and "Traceback" not in err


def test_a_trees_books_are_its_own_verdicts(pair):
    """Acceptance is read off the tree's own verdicts, not off its verify input as if it were a chain:
    one entry per round, the path's accepted depths and the miss that ended it."""
    from harness.theory import analysis

    m = generate(pair, PROMPTS[0], _tree("0+1+00+000"))
    assert len(m.judged_steps) == m.target_forwards
    accepted, rejected = analysis.acceptance_steps(m)
    assert accepted == m.accepted == sum(sum(j) for j in m.judged_steps)
    assert rejected == sum(False in j for j in m.judged_steps) > 0
    first = analysis.acceptance_by_position(m)[0]
    assert first == [sum(1 for j in m.judged_steps if j), sum(1 for j in m.judged_steps if j and j[0])]


def test_the_sweep_measures_a_tree_beside_its_chain(tmp_path):
    from harness.experiments import humaneval, sweep
    from harness.settings import configs

    arms = "t=w8af32,d=w8af32,kernels=invariant,dk=invariant"
    spec = f"{arms},k=3;{arms},tree=0+1+00+000"
    chain, tree = configs.parse_configs(spec)
    assert chain.label == "t_w8af32-d_w8af32-K3-constant-invariant-dk_invariant"
    assert tree.label == "t_w8af32-d_w8af32-tree_0+1+00+000-invariant-dk_invariant"
    with pytest.raises(HarnessError, match="remove k and sched"):
        configs.parse_configs(f"{arms},k=3,tree=0+1")
    with pytest.raises(HarnessError, match="kernels=invariant,dk=invariant"):
        configs.parse_configs("t=w8af32,d=w8af32,tree=0+1")
    with pytest.raises(HarnessError, match="joined by +"):
        configs.parse_configs(f"{arms},tree=0+x")
    result = sweep.run_sweep(
        "tiny-qwen2", [chain, tree], humaneval.prompts(2, 8), 8, tmp_path / "rows.jsonl", progress=False
    )
    by_label = {r.config.label: r for r in result.results}
    assert by_label[tree.label].identical and by_label[chain.label].identical
    assert by_label[tree.label].predicted_speedup is None  # Leviathan's formula is a chain's
    assert by_label[chain.label].predicted_speedup is not None


def test_the_results_page_names_the_tree_tiers_own_test():
    """A tree tier's divergence rows reproduce through the tree's own test, which exists."""
    from pathlib import Path

    from harness.report import page

    node = page.tier_test("gguf / invariant / tree 0+1+00", "qwen2.5-coder-1.5b")
    assert node == "perf/test_decode.py::test_precision_tier_real_tree[qwen2.5-coder-1.5b]"
    source = (Path(__file__).parents[1] / "perf" / "test_decode.py").read_text()
    assert "def test_precision_tier_real_tree(" in source


# --------------------------------------------------------------------------- synthetic acceptance


def _synthetic(p: float, k: int = 4, new: int = 160, **kw) -> GenerationSettings:
    return GenerationSettings(
        mode="assisted",
        max_new_tokens=new,
        ignore_eos=True,
        num_assistant_tokens=k,
        synthetic_acceptance=p,
        **kw,
    )


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_synthetic_acceptance_at_its_ends_accepts_nothing_or_everything(pair, p):
    """At p = 0 every round emits the target's one token (the output is the plain one); at p = 1
    every proposal is taken, whatever the target would have chosen."""
    m = generate(pair, PROMPTS[0], _synthetic(p, new=40))
    assert m.drafted > 0 and m.accepted == (m.drafted if p else 0)
    if p == 0.0:
        assert m.output_ids == generate(pair, PROMPTS[0], _plain(40)).output_ids
        assert m.target_forwards == 40


def test_synthetic_acceptance_draws_each_position_at_its_rate_and_repeats_by_seed(pair):
    """Position i of a chain is accepted when its draw and every earlier one passed: at rate p^(i+1),
    within four standard errors over the rounds that drafted it; the same seed repeats the rounds."""
    from harness.theory import analysis

    p = 0.6
    m = generate(pair, PROMPTS[2], _synthetic(p, new=240))
    counts = analysis.acceptance_by_position(m)
    assert len(counts) == 4
    for i, (drafted, accepted) in enumerate(counts):
        expected = p ** (i + 1)
        # Conditioned on being drafted, position i passes when its draws 0..i all do.
        assert abs(accepted / drafted - expected) <= 4 * math.sqrt(expected * (1 - expected) / drafted), (
            counts
        )
    again = generate(pair, PROMPTS[2], _synthetic(p, new=240))
    assert again.output_ids == m.output_ids and analysis.acceptance_by_position(again) == counts
    other = generate(pair, PROMPTS[2], _synthetic(p, new=240, seed=7))
    assert analysis.acceptance_by_position(other) != counts


def test_synthetic_rows_carry_the_setting_and_its_reproduce_command(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    flags = ["--target_kernels", "invariant", "--draft_kernels", "invariant", "--target_precision", "w8af32"]
    flags += ["--draft_precision", "w8af32", "--synthetic_acceptance", "0.5"]
    code, out, err = run_cli(capsys, *TINY, "--compare", *flags, "--json", str(path))
    assert code == 0, err
    rows = read_json_rows(path)
    assert {r["synthetic_acceptance"] for r in rows if r["mode"] == "assisted"} == {0.5}
    assert {r["synthetic_acceptance"] for r in rows if r["mode"] == "plain"} == {None}
    assert "--synthetic_acceptance 0.5" in out
