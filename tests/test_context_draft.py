"""Proposals from the context beside the draft model (``--context_draft``): what they propose, how
they adapt, and that the output stays the target's own."""

from __future__ import annotations

import pytest
from helpers import load_pair
from test_cli import TINY, read_json_rows, run_cli

from harness.base.errors import HarnessError
from harness.decoding.context import (
    LONGEST_MATCH,
    MIN_MATCH,
    RUNS,
    ChainRecord,
    ContextProposer,
    RoundPlan,
    RowCosts,
)
from harness.decoding.generation import generate
from harness.settings.setup import GenerationSettings


def _proposer(seq: list[int], limit: int = 16) -> ContextProposer:
    proposer = ContextProposer(limit)
    proposer.extend(seq)
    return proposer


def test_the_continuation_of_the_latest_tokens_is_proposed():
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 50, 51, 1, 2, 3]
    assert _proposer(seq).propose(room=4) == [4, 5, 6, 7]
    assert _proposer(seq).propose(room=100) == [4, 5, 6, 7, 8, 9, 10, 50]  # its first length: 8


def test_the_place_whose_match_runs_furthest_back_is_taken():
    # [7, 8, 9] ends two earlier places; the later one shares only the three, the earlier one five.
    seq = [5, 6, 7, 8, 9, 100, 0, 0, 7, 8, 9, 200, 0, 0, 5, 6, 7, 8, 9]
    assert _proposer(seq).propose(room=1) == [100]


def test_the_continuation_after_a_drafts_unverified_tokens_is_proposed():
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 50, 51, 1, 2]
    proposer = _proposer(seq)
    assert proposer.propose(room=4, after=[3]) == [4, 5, 6, 7]  # [2, 3] + the match, as if emitted
    assert proposer.propose(room=4, after=[99]) == []
    assert proposer.seq == seq  # the draft's tokens are not taken into the sequence


def test_a_chain_is_continued_from_a_copy_only_where_its_rows_pay():
    copy = list(range(20, 40))
    plan = RoundPlan(_proposer([*copy, 0, *copy[:12]]))
    for rows in (1, 5, 9, 17, 2):
        plan.observe(rows, 30.0 + 0.3 * (rows - 1))
    for _ in range(4):
        plan.chain_kept(3, 3)
    assert plan.extension([32, 33, 34], room=8) == [*copy[15:], 0, 20, 21]  # a copy, rows nearly free
    assert plan.extension([32, 33, 99], room=8) == []  # the chain's guesses left the copy
    short = RoundPlan(_proposer([5, 6, 7, 8, 9, 10, 0, 0, 5]))  # a phrase, not a copy: left alone
    short.observe(1, 30.0)
    assert short.extension([6, 7], room=8) == []
    dear = RoundPlan(_proposer([*copy, 0, *copy[:12]]))
    for rows in (1, 5, 9, 17, 2):
        dear.observe(rows, 30.0 + 20.0 * (rows - 1))
    for _ in range(8):
        dear.chain_kept(3, 0)  # chains kept whole rarely: their continuation seldom counts
    assert dear.extension([32, 33, 34], room=8) == []


def test_nothing_is_proposed_without_an_earlier_match():
    assert _proposer([1, 2, 3, 4, 5, 6]).propose(room=8) == []
    assert _proposer([1, 2]).propose(room=8) == []
    assert _proposer([1, 2, 3, 1, 2, 3]).propose(room=0) == []


def test_the_length_and_the_match_asked_for_follow_how_proposals_fared():
    proposer = _proposer([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3], limit=12)
    proposer.verified(8, 8)
    assert proposer.length == 12  # doubled, within the limit
    proposer.verified(12, 3)
    assert proposer.length == 5 and proposer.need == MIN_MATCH
    proposer.verified(5, 0)  # a miss at once: the next proposal needs a longer match
    assert proposer.need == MIN_MATCH + 2
    assert proposer.propose(room=8) == []  # this sequence's match is only three long
    proposer.verified(2, 1)
    assert proposer.need == MIN_MATCH + 1


def test_a_copys_long_match_and_a_reused_phrases_short_one_are_judged_apart():
    copy = list(range(50)) + list(range(35))  # the output copies the prompt: the match runs far back
    proposer = _proposer(copy)
    assert proposer.propose(room=8) == list(range(35, 43)) and proposer.run == LONGEST_MATCH
    proposer.verified(8, 8)
    copying = proposer.keep_rate
    proposer.extend([*copy, 500, 600, 5, 6, 7])  # then a phrase recurs after other tokens
    assert proposer.propose(room=8)[:2] == [8, 9] and proposer.run == MIN_MATCH
    assert proposer.keep_rate == pytest.approx(0.75)  # the prior: no short match was judged yet
    assert copying > 0.9
    proposer.verified(2, 0)
    assert proposer.keep_rate < 0.75


def test_a_longer_match_is_trusted_at_least_as_far_as_a_shorter_one_has_earned():
    # A copy that starts after a renamed name: its match runs a few tokens back, then further each
    # round, reaching a kind of match whose own record is still the prior.
    copy = list(range(50)) + [900, 901] + list(range(25, 30))
    proposer = _proposer(copy)
    assert proposer.propose(room=8) == list(range(30, 38)) and proposer.run < RUNS[0]
    assert proposer.keep_rate == pytest.approx(0.75)  # nothing judged yet: the prior
    for _ in range(3):
        proposer.verified(8, 8)
    short = proposer.keep_rate
    assert short > 0.9
    proposer.extend([*copy, *range(30, 38)])  # kept: the match now runs back past the edit's end
    assert proposer.propose(room=8) == list(range(38, 46)) and proposer.run >= RUNS[0]
    assert proposer.keep_rate == pytest.approx(short)  # not the longer kind's own prior


def test_a_forwards_cost_by_rows_is_fitted_to_what_the_rounds_measured():
    costs = RowCosts()
    assert costs.ms(1) is None
    for _ in range(3):
        costs.observe(4, 13.0)  # one count of rows: a slope cannot be fitted, the prior's is taken
    assert costs.ms(4) == pytest.approx(13.0)
    assert costs.ms(1) == pytest.approx(13.0 / (1 + 3 * RowCosts.PRIOR_SLOPE))
    for rows in (1, 2, 4, 8, 16, 3, 9):  # a host where each row costs half a one-row forward
        costs.observe(rows, 10.0 + 5.0 * (rows - 1))
    for _ in range(120):  # the first entries fade
        costs.observe(9, 50.0)
        costs.observe(2, 15.0)
    assert costs.ms(1) == pytest.approx(10.0, rel=1e-4) and costs.ms(17) == pytest.approx(90.0, rel=1e-4)


def _plan(one_ms: float, row_ms: float, misses: int = 0) -> RoundPlan:
    """A plan on a host whose forwards cost ``one_ms`` plus ``row_ms`` a row past the first, after a
    context proposal kept whole and then ``misses`` kept not at all."""
    plan = RoundPlan(_proposer([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 1, 2, 3]))
    for rows in (1, 5, 9, 17, 2):
        plan.observe(rows, one_ms + row_ms * (rows - 1))
    plan.context.verified(8, 8)
    for _ in range(misses):
        plan.context.verified(4, 0)
    return plan


def test_a_context_proposal_is_cut_where_its_rows_cost_more_than_they_are_expected_to_gain():
    found = list(range(4, 20))
    cheap, dear = _plan(30.0, 0.3), _plan(30.0, 9.0)
    assert cheap.choose(found) == found  # rows nearly free: all 16
    tokens = dear.choose(found)  # a row a third of a step: a shorter proposal pays more
    assert 1 <= len(tokens) < len(found) and tokens == found[: len(tokens)]
    doubtful = _plan(30.0, 9.0, misses=16)  # kept nothing since: at a row's price, no proposal pays
    assert doubtful.context.keep_rate < 0.3
    assert doubtful.choose(found) == []  # the draft model's chain runs instead
    assert _plan(30.0, 0.3, misses=16).choose(found)  # where a row is nearly free, it still pays


def _chain_plan(one_ms: float, row_ms: float, draft_ms: float, kept: int, proposed: int) -> RoundPlan:
    """A plan whose verifications cost ``one_ms`` plus ``row_ms`` a row past the first, whose draft
    steps take ``draft_ms``, and whose draft chains had ``kept`` of ``proposed`` kept, round after round."""
    plan = RoundPlan(_proposer([1, 2, 3]))
    for rows in (1, 2, 3, 4, 2):
        plan.observe(rows, one_ms + row_ms * (rows - 1))
    for _ in range(30):
        plan.chain_kept(proposed, kept)
        plan.draft_step(draft_ms)
    return plan


def test_a_chains_depth_is_the_one_expected_to_gain_most_per_ms():
    assert RoundPlan(_proposer([1, 2, 3])).chain_depth(3) == 3  # nothing timed yet: the registered K
    kept_whole = _chain_plan(30.0, 0.5, 3.0, kept=3, proposed=3)
    assert kept_whole.chain_depth(3) == 3 and kept_whole.chain_depth(5) == 5
    # Half a chain's tokens kept, a draft step a third of a target's, each row a tenth: three
    # tokens' rows and draft steps cost more than the third is expected to gain.
    doubtful = _chain_plan(30.0, 3.0, 10.0, kept=1, proposed=2)
    depth = doubtful.chain_depth(3)
    assert 1 <= depth < 3
    # Leviathan's speedup at that depth beats every other the plan could have chosen.
    from harness.theory.analysis import leviathan_speedup_verify

    alpha = doubtful.chain_hits / (doubtful.chain_hits + doubtful.chain_misses)
    speed = [leviathan_speedup_verify(alpha, k, 10.0 / 30.0, (30.0 + 3.0 * k) / 30.0) for k in (1, 2, 3)]
    assert speed[depth - 1] == pytest.approx(max(speed), rel=1e-3)
    # Nothing kept: no depth pays, and the chain still proposes one (plain steps are ChainRecord's).
    assert _chain_plan(30.0, 3.0, 10.0, kept=0, proposed=3).chain_depth(3) == 1
    assert doubtful.chain_depth(1) == 1


def test_a_chain_proposes_one_token_while_the_request_copies_its_context():
    plan = RoundPlan(_proposer([1, 2, 3]))
    assert plan.depth(3, windowed=False) == 3  # nothing copied yet: the registered K
    plan.round_kept(1)  # one token kept: a coincidence as often as a copy
    assert plan.depth(3, windowed=False) == 3
    plan.round_kept(2)
    assert plan.depth(3, windowed=False) == 1 and plan.depth(3, windowed=True) == 1
    for _ in range(RoundPlan.COPY_ROUNDS):
        plan.round_kept(0)
        assert plan.depth(3, windowed=False) == 1
    plan.round_kept(0)  # COPY_ROUNDS + 1 rounds without a copy
    assert plan.depth(3, windowed=False) == 3
    assert plan.depth(3, windowed=True) == plan.chain_depth(3)
    plan.round_kept(RoundPlan.COPY_TOKENS)
    assert plan.depth(3, windowed=False) == 1


def test_the_loop_drafts_as_deep_as_the_plan_says(pair, monkeypatch):
    """Every chain round drafts the depth the plan gave it: one token after a round kept tokens
    from the context (here accepted by a seeded draw, as the tiny targets copy nothing), else K."""
    from harness.decoding import trees

    depths: list[int] = []
    drafted: list[int] = []
    plan_depth, propose = RoundPlan.depth, trees._Draft.propose

    def depth(self, k, windowed):
        depths.append(plan_depth(self, k, windowed))
        return depths[-1]

    def draft(self, seq, nodes, threshold=0.0):
        drafted.append(max(len(p) for p in nodes))
        return propose(self, seq, nodes, threshold)

    monkeypatch.setattr(RoundPlan, "depth", depth)
    monkeypatch.setattr(trees._Draft, "propose", draft)
    s = GenerationSettings(
        mode="assisted",
        max_new_tokens=64,
        ignore_eos=True,
        num_assistant_tokens=3,
        context_draft=8,
        synthetic_acceptance=0.9,
    )
    m = generate(pair, PROMPTS[0], s)
    assert m.from_context > 0
    assert 1 in depths and 3 in depths
    # The budget's room cuts the last rounds' chains shorter, never a chain of one.
    assert len(drafted) == len(depths) and all(d <= p for d, p in zip(drafted, depths, strict=True))
    assert all(d == p for d, p in zip(drafted, depths, strict=True) if p == 1)
    assert drafted[: len(drafted) // 2] == depths[: len(depths) // 2]


def test_a_long_prompts_chain_proposes_no_deeper_than_its_plan_says(pair, monkeypatch):
    """On a prompt longer than the draft's window each chain round proposes at most the plan's depth
    (here one token), and the output is plain decoding's."""
    from harness.decoding import trees

    monkeypatch.setattr(RoundPlan, "chain_depth", lambda self, k: 1)
    monkeypatch.setattr(RoundPlan, "choose", lambda self, found: [])  # the chain every round
    monkeypatch.setattr(RoundPlan, "extension", lambda self, chain, room: [])
    prompt = [3 + (i * 7919) % 200 for i in range(trees.DRAFT_WINDOW + 40)]  # nothing recurs soon
    plain = generate(pair, prompt, GenerationSettings(max_new_tokens=32, ignore_eos=True))
    s = GenerationSettings(mode="assisted", max_new_tokens=32, ignore_eos=True, context_draft=8)
    m = generate(pair, prompt, s)
    assert m.output_ids == plain.output_ids
    rounds = [f.input_tokens for f in m.forwards if f.role == "target" and f.cache_tokens]
    assert m.drafted > 0 and max(rounds) == 2, rounds  # the pending token and one proposal at most


def test_a_kind_of_match_passed_over_is_tried_again():
    # A copy may begin where proposals from such matches kept failing: passed over, their record
    # fades toward the prior until a proposal pays again.
    plan, found = _plan(30.0, 9.0, misses=16), list(range(4, 20))
    passed = 0
    while not plan.choose(found):
        passed += 1
        assert passed < 50, "never tried again"
    assert passed >= 1  # not at once: the misses count for a round or more


def _rounds(
    record: ChainRecord, rounds: int, tokens: int | list[int], steps: float, plain_ms: float = 30.0
) -> str:
    """Which of ``rounds`` rounds ran the chain ("c", each emitting ``tokens`` in ``steps`` plain
    steps' time; a list: its counts in turn) or a plain step ("p")."""
    counts = [tokens] if isinstance(tokens, int) else tokens
    ran = ""
    for _ in range(rounds):
        if record.runs():
            record.chain_round(counts[ran.count("c") % len(counts)], steps * plain_ms)
            ran += "c"
        else:
            record.plain_step(plain_ms)
            ran += "p"
    return ran


def test_a_chain_that_emits_less_than_plain_steps_gives_way_to_them_and_is_tried_again():
    record = ChainRecord()
    # A question about a long document: under two tokens a round that takes 2.5 plain steps' time.
    ran = _rounds(record, 160, 1, 2.5)
    sample = ChainRecord.SAMPLE_GAPS[0]
    assert ran[: sample + 1] == "c" * sample + "p"  # a plain step is timed before any is judged
    # Judged from then on, the rounds so far with it: the chain gives way after its next round.
    assert ran[sample + 1 : sample + 3] == "cp"
    tries = [i for i, r in enumerate(ran) if r == "c"][sample:]
    gaps = [b - a - 1 for a, b in zip(tries, tries[1:], strict=False) if b - a > 1]
    wait, longest = ChainRecord.FIRST_WAIT, ChainRecord.LONGEST_WAIT
    assert gaps[:4] == [wait, 2 * wait, 4 * wait, min(longest, 8 * wait)]  # each failed try waits longer
    assert set(gaps[4:]) == {longest}
    # The chain pays again: each try that pays brings the next one sooner, until it runs every round
    # but for a plain step timed now and then.
    ran = _rounds(record, 200, 4, 2.2)
    assert ran[-100:].count("p") <= 100 // ChainRecord.SAMPLE_GAPS[-1] + 1 and "c" * 40 in ran[-100:]


@pytest.mark.parametrize(("tokens", "steps"), [([1], 1.2), ([1, 2], 1.7), ([1, 2, 1, 2, 2], 1.7)])
def test_a_chain_a_little_slower_than_plain_steps_gives_way_to_them(tokens, steps):
    # A question about a 2K-token document: 1.45 tokens a round of 1.7 plain steps' time (0.85 a
    # step). The prior's belief that chains pay fades with the rounds, so it does not hold such a
    # chain at the threshold.
    record = ChainRecord()
    ran = _rounds(record, 300, tokens, steps)
    assert ran[-200:].count("c") < 50 and record.rate < 1.0


def test_a_chain_that_pays_runs_every_round_even_after_a_bad_start():
    record = ChainRecord()
    # The speed gate's prompt keeps about 2.7 tokens a round of about 2.2 plain steps' time; three
    # rounds that kept nothing at its start do not stop it.
    ran = _rounds(record, 3, 1, 1.6) + _rounds(record, 150, 3, 2.2)
    gaps = [*ChainRecord.SAMPLE_GAPS, *[ChainRecord.SAMPLE_GAPS[-1]] * 10]
    timed = "".join("c" * gap + "p" for gap in gaps)[: len(ran)]  # only the plain steps it times
    assert ran == timed and record.rate > 1.0


def test_the_chain_runs_until_a_plain_step_was_timed():
    record = ChainRecord()
    assert record.rate is None
    first = ChainRecord.SAMPLE_GAPS[0]
    assert _rounds(record, first, 1, 100.0) == "c" * first
    assert record.wait == 0 and not record.runs()  # now a plain step, to weigh the chain against
    record.plain_step(30.0)
    assert record.rate < 1.0 and record.wait == 0  # judged at the next chain round
    assert _rounds(record, 2, 1, 100.0) == "cp"


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-llama"])
def pair(request):
    return load_pair(
        request.param,
        target_precision="w8af32",
        target_kernels="invariant",
        draft_precision="w8af32",
        draft_kernels="invariant",
    )


# A prompt that repeats itself, and prompts that do not.
PROMPTS = ([3, 4, 5, 6, 7, 8, 9, 10, 11] * 4, list(range(3, 40)), [7, 7, 7, 19, 4, 4, 100, 3])


@pytest.mark.parametrize("schedule", ["constant", "dynamic"])
@pytest.mark.parametrize("k", [1, 3])
def test_the_output_is_the_targets_own_greedy_output(pair, k, schedule):
    for prompt in PROMPTS:
        plain = generate(pair, prompt, GenerationSettings(max_new_tokens=48, ignore_eos=True))
        s = GenerationSettings(
            mode="assisted",
            max_new_tokens=48,
            ignore_eos=True,
            num_assistant_tokens=k,
            assistant_schedule=schedule,
            context_draft=8,
        )
        m = generate(pair, prompt, s)
        assert m.output_ids == plain.output_ids
        assert m.from_context is not None and 0 <= m.from_context <= m.accepted <= m.drafted


def test_a_chain_continued_from_the_context_keeps_the_targets_output(pair, monkeypatch):
    """Every chain the context can continue is continued (as far as the room allows): the rounds'
    books count what the context's tokens added, and the output is plain decoding's."""
    monkeypatch.setattr(RoundPlan, "choose", lambda self, found: [])  # the chain every round
    monkeypatch.setattr(RoundPlan, "extension", lambda self, chain, room: self.context.propose(room, chain))
    extended = 0
    for prompt in PROMPTS:
        plain = generate(pair, prompt, GenerationSettings(max_new_tokens=48, ignore_eos=True))
        s = GenerationSettings(mode="assisted", max_new_tokens=48, ignore_eos=True, context_draft=8)
        m = generate(pair, prompt, s)
        assert m.output_ids == plain.output_ids
        assert 0 <= m.from_context <= m.accepted <= m.drafted
        extended += sum(f.input_tokens > 4 for f in m.forwards if f.role == "target" and f.cache_tokens)
    assert extended > 0  # some verification held more than the chain of 3 and its pending token


def test_a_plain_step_is_the_median_of_the_latest_timed():
    record = ChainRecord()
    for ms in (38.0, 29.0, 30.0):  # the first after chain rounds is slow
        record.plain_step(ms)
    assert record.plain_ms == 30.0
    for ms in (50.0,) * ChainRecord.SAMPLES:  # the host slowed down: the latest count
        record.plain_step(ms)
    assert record.plain_ms == 50.0


def test_plain_steps_between_chain_rounds_keep_the_targets_output(pair, monkeypatch):
    """Where the plan takes plain steps (here two of every three rounds the chain would run) on a
    prompt longer than the draft's window, the draft catches up on the tokens it did not see when
    next asked, and the output is plain decoding's."""
    from harness.decoding import trees

    turns = iter([True, False, False] * 100)
    monkeypatch.setattr(ChainRecord, "runs", lambda self: next(turns))
    prompt = [3 + (i * 7919) % 200 for i in range(trees.DRAFT_WINDOW + 40)]  # nothing recurs soon
    plain = generate(pair, prompt, GenerationSettings(max_new_tokens=32, ignore_eos=True))
    s = GenerationSettings(mode="assisted", max_new_tokens=32, ignore_eos=True, context_draft=8)
    m = generate(pair, prompt, s)
    assert m.output_ids == plain.output_ids
    target = [f for f in m.forwards if f.role == "target"]
    single = [f for f in target[1:] if f.input_tokens == 1]  # plain steps
    assert len(single) >= 8, [f.input_tokens for f in target]
    # Each chain round after plain steps feeds the draft what it did not see in one forward.
    assert any(f.input_tokens > 2 for f in m.forwards if f.role == "draft" and f.cache_tokens)


def test_a_prompt_the_draft_reads_whole_never_takes_a_plain_step_for_the_chain(pair, monkeypatch):
    """Within the draft's window the chain runs wherever the context proposes nothing, whatever its
    record reads: its rounds do not depend on the host's speed."""
    monkeypatch.setattr(ChainRecord, "runs", lambda self: False)
    for prompt in PROMPTS[1:]:
        s = GenerationSettings(mode="assisted", max_new_tokens=32, ignore_eos=True, context_draft=8)
        m = generate(pair, prompt, s)
        target = [f for f in m.forwards if f.role == "target"]
        assert m.drafted > 0 and len(target) >= 4  # rounds were drafted and verified, not one forward
        assert all(f.input_tokens > 1 for f in target[:-1]), [f.input_tokens for f in target]


def test_the_draft_reads_a_long_prompts_recent_window_only(pair):
    """With proposals from the context, the draft model's first forward reads a long prompt's last
    ``DRAFT_READ`` tokens, not the whole prompt, and reads a prompt of up to ``DRAFT_WINDOW``
    tokens whole; the output stays plain decoding's either way."""
    from harness.decoding import trees

    assert trees.DRAFT_READ <= trees.DRAFT_WINDOW
    s = GenerationSettings(mode="assisted", max_new_tokens=24, ignore_eos=True, context_draft=8)
    for length, read in (
        (trees.DRAFT_WINDOW + 90, trees.DRAFT_READ),
        (trees.DRAFT_WINDOW, trees.DRAFT_WINDOW),
    ):
        prompt = [3 + (i * 7919) % 200 for i in range(length)]  # nothing recurs soon
        plain = generate(pair, prompt, GenerationSettings(max_new_tokens=24, ignore_eos=True))
        m = generate(pair, prompt, s)
        assert m.output_ids == plain.output_ids
        first = next(f for f in m.forwards if f.role == "draft")
        assert (first.cache_tokens, first.input_tokens) == (0, read)
        assert next(f for f in m.forwards if f.role == "target").input_tokens > len(prompt)  # with proposals


@pytest.mark.real
@pytest.mark.slow
def test_an_edit_that_copies_its_code_is_proposed_from_the_context(pairs, monkeypatch):
    """The offline pair asked to rename a class in code it is given: most of the answer is the code
    again, which the context proposes and the target keeps, with the output plain decoding's.

    The plan cuts each proposal to the length the host's own verifications make pay, so on a host
    whose extra rows are dear, or in a slow phase of one, it verified the copy a token or two at a
    time (17 verifications for 48 tokens). The proposer and the verification are what this test
    holds, not the host's phase: each verification is booked as one of a host whose extra rows cost
    a tenth of a step (``RowCosts`` has its own tests)."""
    import inspect

    from harness.decoding import engines
    from harness.experiments import equivalence
    from harness.pairs import models

    booked = RowCosts.observe
    monkeypatch.setattr(RowCosts, "observe", lambda costs, rows, _ms: booked(costs, rows, 30.0 + 3.0 * rows))

    pairs.require_weights(models.DEFAULT_PAIR)  # a machine without them skips, saying where to get them
    spec = models.get_pair(models.DEFAULT_PAIR)
    pair = engines.load(spec, engines.resolve(spec))
    code = inspect.getsource(equivalence.EqualityRuns)
    text = (
        "<|im_start|>user\nRename the class EqualityRuns to EqualCases in this code and output the whole "
        f"code:\n```python\n{code}```<|im_end|>\n<|im_start|>assistant\n```python\n"
    )
    ids = pair.tokenizer(text)["input_ids"]
    plain = generate(pair, ids, GenerationSettings(max_new_tokens=48, ignore_eos=True))
    registered = spec.decoding
    s = GenerationSettings(
        mode="assisted",
        max_new_tokens=48,
        ignore_eos=True,
        num_assistant_tokens=registered.num_assistant_tokens,
        assistant_schedule=registered.assistant_schedule,
        context_draft=16,
    )
    m = generate(pair, ids, s)
    assert m.output_ids == plain.output_ids
    assert m.from_context >= len(m.output_ids) // 2, (m.from_context, m.accepted, m.drafted)
    assert m.target_forwards < len(m.output_ids) // 3  # several tokens kept per verification


def test_eos_and_stop_strings_end_where_plain_decoding_ends(pair):
    prompt = PROMPTS[0]
    plain = generate(pair, prompt, GenerationSettings(max_new_tokens=40, ignore_eos=True)).output_ids
    eos = plain[len(plain) // 2]
    stop = next(t for i in range(10, 30) if (t := pair.tokenizer.decode(plain[i : i + 2])).strip())
    for extra in (dict(eos_token_id=eos), dict(stop_strings=(stop,))):
        want = generate(pair, prompt, GenerationSettings(max_new_tokens=40, **extra)).output_ids
        got = generate(
            pair, prompt, GenerationSettings(mode="assisted", max_new_tokens=40, context_draft=8, **extra)
        ).output_ids
        assert got == want


def test_context_drafting_is_greedy_bounded_and_on_the_invariant_kernels():
    with pytest.raises(HarnessError, match="--context_draft decodes greedily"):
        GenerationSettings(mode="assisted", do_sample=True, context_draft=8).validate()
    with pytest.raises(HarnessError, match="between 0 \\(off\\) and 64"):
        GenerationSettings(mode="assisted", context_draft=65).validate()
    stock = load_pair("tiny-llama")
    with pytest.raises(HarnessError, match="--context_draft\\) run on the harness's batch-invariant kernels"):
        generate(stock, [3, 4, 5], GenerationSettings(mode="assisted", context_draft=8))


def test_context_drafting_from_the_command_line_reaches_rows_and_reproduce_command(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    flags = ["--target_kernels", "invariant", "--draft_kernels", "invariant", "--target_precision", "w8af32"]
    flags += ["--draft_precision", "w8af32", "--context_draft", "12"]
    code, out, err = run_cli(capsys, *TINY, "--compare", *flags, "--json", str(path))
    assert code == 0, err
    rows = read_json_rows(path)
    assisted = [r for r in rows if r["mode"] == "assisted"]
    assert {r["context_draft"] for r in assisted} == {12} and all(
        r["accepted_from_context"] >= 0 for r in assisted
    )
    assert {r["context_draft"] for r in rows if r["mode"] == "plain"} == {None}
    by_mode = {(r["example"], r["mode"]): r["output_ids"] for r in rows}
    assert all(by_mode[(e, "plain")] == by_mode[(e, "assisted")] for e in (1, 2))
    assert "--context_draft 12" in out


def test_the_sweep_measures_context_drafting_beside_its_chain(tmp_path, capsys):
    from harness import cli
    from harness.settings import configs
    from harness.settings.results import read_rows

    chain = "t=w8af32,kernels=invariant,d=w8af32,dk=invariant,k=3"
    spec = f"{chain};{chain},ctx=8"
    plain, with_context = configs.parse_configs(spec)
    assert with_context.label == plain.label + "-ctx8" and with_context.settings(8).context_draft == 8
    with pytest.raises(HarnessError, match="ctx=8 proposes from the context beside a draft model"):
        configs.parse_configs("t=fp32,k=3,ctx=8")
    argv = ["--model_name", "tiny-llama", "--task", "sweep", "--limit", "2", "--max_new_tokens", "32",
            "--results_dir", str(tmp_path), "--no_progress", "--sweep", spec]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    rows = [r for path in (tmp_path / "rows" / "sweep").glob("*.jsonl") for r in read_rows(path)]
    ctx_rows = [r for r in rows if r.context_draft == 8]
    assert len(ctx_rows) == 2 and all(r.accepted_from_context is not None for r in ctx_rows)
    plain_out = {r.example: r.output_ids for r in rows if r.mode == "plain"}
    assert all(r.output_ids == plain_out[r.example] for r in ctx_rows)
    # Leviathan's formula is a chain of K draft tokens: proposals from the context get no prediction
    # (none to warn against), the chain beside them keeps its own.
    from harness.experiments import sweep

    by_mode = {r.example: r for r in rows if r.mode == "plain"}
    chain_rows = {r.example: r for r in rows if r.mode == "assisted" and not r.context_draft}
    assert sweep.summarize(plain, by_mode, chain_rows, None).predicted_speedup_verify is not None
    result = sweep.summarize(with_context, by_mode, {r.example: r for r in ctx_rows}, None)
    assert result.predicted_speedup is None and result.predicted_speedup_verify is None


def test_the_sweep_runs_long_contexts(tmp_path, capsys):
    """``--task sweep --context-tokens N``: every configuration beside plain decoding on prompts of
    exactly N tokens, the command it prints carrying the lengths (so a rerun resumes them)."""
    from harness import cli
    from harness.settings.results import read_rows

    chain = "t=w8af32,kernels=invariant,d=w8af32,dk=invariant,k=3"
    argv = ["--model_name", "tiny-llama", "--task", "sweep", "--context-tokens", "96,160", "--limit", "1",
            "--max_new_tokens", "8", "--results_dir", str(tmp_path), "--no_progress",
            "--sweep", f"{chain};{chain},ctx=8"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    rows = [r for path in (tmp_path / "rows" / "sweep").glob("*.jsonl") for r in read_rows(path)]
    assert sorted({(r.prompt_tokens, r.mode) for r in rows}) == [
        (96, "assisted"), (96, "plain"), (160, "assisted"), (160, "plain")
    ]  # fmt: skip
    assert len(rows) == 6  # plain once per prompt, each configuration beside it
    plain_out = {r.prompt_tokens: r.output_ids for r in rows if r.mode == "plain"}
    assert all(r.output_ids == plain_out[r.prompt_tokens] for r in rows)
    page = next((tmp_path).glob("*/sweep-*.md")).read_text()
    assert "--context-tokens 96,160" in page


@pytest.mark.parametrize(
    "given, expected",
    [
        ({}, 16),  # a greedy chain on the invariant kernels: the pair's registered proposals
        ({"context_draft": 0}, 0),  # said off: the draft's chain alone
        ({"context_draft": 8}, 8),  # said: as said
        ({"do_sample": True}, 0),
        ({"draft_tree": "0+1+00"}, 0),
        ({"synthetic_acceptance": 0.5}, 0),
        ({"mode": "prompt_lookup"}, 0),
        ({"mode": "plain"}, 0),
    ],
)
def test_the_offline_pair_proposes_from_the_context_where_its_greedy_chain_can(given, expected):
    from harness.decoding import engines
    from harness.pairs import models

    spec = models.get_pair(models.DEFAULT_PAIR)
    decoding = GenerationSettings(**{"mode": "assisted", **given})
    assert engines.resolve(spec, decoding=decoding).decoding.context_draft == expected


def test_the_registered_proposals_stay_off_where_the_harness_loop_cannot_run_them():
    from harness.decoding import engines
    from harness.pairs import models

    spec = models.get_pair(models.DEFAULT_PAIR)
    chain = GenerationSettings(mode="assisted")
    for settings in (
        {"draft_kernels": "stock"},
        {"target_kernels": "stock", "target_precision": "w8af32"},
        {"target_backend": "onnxruntime"},
        {"engine": "llama.cpp"},
    ):
        run = engines.resolve(spec, decoding=chain, **settings)
        assert run.decoding.context_draft == 0, settings
    # Another pair registers none.
    tiny = models.get_pair("tiny-llama")
    assert engines.resolve(tiny, decoding=chain).decoding.context_draft == 0
