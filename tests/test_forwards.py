"""``harness.experiments.forwards``: per-forward cost by M, the measurement behind c and v."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from helpers import load_pair

from harness.base import platforms
from harness.base.errors import HarnessError
from harness.experiments import forwards


def test_measure_times_every_precision_kernels_and_m():
    read = forwards.bandwidth_reader(size_mib=8)
    calls = []

    def reading() -> float:
        calls.append(read())
        return calls[-1]

    rows = forwards.measure(
        "tiny-qwen2",
        "target",
        ["fp32", "w8af32"],
        ["stock", "invariant"],
        [1, 3],
        repetitions=2,
        bandwidth=reading,
    )
    assert {(r.precision, r.kernels, r.m) for r in rows} == {
        (p, k, m) for p in ("fp32", "w8af32") for k in ("stock", "invariant") for m in (1, 3)
    }
    assert all(0 < r.ms_min <= r.ms for r in rows)
    # the bandwidth is read after each of the 3 repetitions (the first one warms up), per model,
    # and each model's costs keep the median of its own readings after the first
    assert len(calls) == 4 * 3
    by_model: dict[tuple[str, str], list] = {}
    for r in rows:
        by_model.setdefault((r.precision, r.kernels), []).append(r)
    for i, mine in enumerate(by_model.values()):
        kept = calls[3 * i + 1 : 3 * i + 3]
        assert {r.bound_gbs for r in mine} == {round(statistics.median(kept), 2)}
    text = forwards.table(rows)
    assert "| target" in text and "M=3" in text and text.count("\n") == 5  # header, rule, 4 lines


def test_draft_role_and_bad_input():
    rows = forwards.measure(
        "tiny-qwen2", "draft", ["w8af32"], ["invariant"], [2], repetitions=1, draft_vocab=100
    )
    assert [(r.role, r.m) for r in rows] == [("draft", 2)]
    with pytest.raises(HarnessError, match="role"):
        forwards.measure("tiny-qwen2", "verifier", ["fp32"], ["stock"], [1])
    with pytest.raises(HarnessError, match="at least 1"):
        forwards.time_forwards(None, [0])


def test_cli_rejects_bad_m(capsys):
    with pytest.raises(SystemExit):
        forwards.main(["--model_name", "tiny-qwen2", "--m", "0"])
    assert "must be positive" in capsys.readouterr().err


def test_onnxruntime_target_is_timed_beside_torch():
    rows = forwards.measure("tiny-qwen2", "target", ["int4"], ["onnxruntime"], [1, 4], repetitions=1)
    assert [(r.precision, r.kernels, r.m) for r in rows] == [
        ("int4", "onnxruntime", 1),
        ("int4", "onnxruntime", 4),
    ]
    assert all(r.ms > 0 for r in rows)
    with pytest.raises(HarnessError, match="--role target"):
        forwards.measure("tiny-qwen2", "draft", ["int4"], ["onnxruntime"], [1])


def test_bytes_read_and_the_bandwidth_bound():
    """The weights a token reads: every weight once, an untied embedding one row per token; the
    table puts M = 1 beside the time those bytes take at the given bandwidth."""

    target = load_pair("tiny-qwen2", with_draft=False).target
    tensors = {id(t): t for t in (*target.parameters(), *target.buffers())}
    everything = sum(t.numel() * t.element_size() for t in tensors.values())
    emb = target.get_input_embeddings().weight
    if target.get_output_embeddings().weight is emb:
        assert forwards.bytes_read(target, 1) == forwards.bytes_read(target, 5) == everything
    else:
        row = emb[0].numel() * emb.element_size()
        untouched = emb.numel() * emb.element_size() - row
        assert forwards.bytes_read(target, 1) == everything - untouched
        assert forwards.bytes_read(target, 3) - forwards.bytes_read(target, 1) == 2 * row
    rows = [forwards.ForwardCost("target", "fp32", "stock", m, 2.0 * m, 2.0 * m, 4_000_000) for m in (1, 2)]
    line = forwards.table(rows, bandwidth_gbs=4.0).splitlines()[-1]
    # 4 MB at 4 GB/s: a 1 ms bound, and M = 1 took 2 ms
    assert [c.strip() for c in line.strip("|").split("|")][-3:] == ["0.004", "1.0", "2.00"]
    # a line's own bandwidth, read between its forwards, stands for the run's: 4 MB at 8 GB/s
    own = [dataclasses.replace(r, bound_gbs=8.0) for r in rows]
    line = forwards.table(own, bandwidth_gbs=4.0).splitlines()[-1]
    assert [c.strip() for c in line.strip("|").split("|")][-3:] == ["0.004", "0.5", "4.00"]
    assert "bound" in forwards.table(own)
    assert forwards.read_bandwidth_gbs(size_mib=8, repetitions=1) > 0


def test_json_rows_feed_the_results_page(tmp_path, capsys):
    """``--json`` keeps every cost with its machine, bandwidth and command, and the results page
    draws the same table from those rows."""
    from harness.report import page
    from harness.settings import results

    rows_file = tmp_path / "results" / "some-machine" / "forwards" / "tiny.jsonl"
    argv = ["--model_name", "tiny-qwen2", "--precisions", "fp32", "--kernels", "stock"]
    argv += ["--m", "1,3", "--repetitions", "1", "--json", str(rows_file)]
    assert forwards.main(argv) == 0
    printed = capsys.readouterr().out
    records = results.read_records(rows_file)
    assert [(r["role"], r["precision"], r["kernels"], r["m"]) for r in records] == [
        ("target", "fp32", "stock", 1),
        ("target", "fp32", "stock", 3),
    ]
    first = records[0]
    assert first["bandwidth_gbs"] > 0 and first["versions"]["torch"] and first["bytes_read"] > 0
    # and the bandwidth read between the model's own forwards, the bound's
    assert first["bound_gbs"] > 0
    assert first["command"].startswith("python -m harness.forwards --model_name tiny-qwen2")
    costs = [forwards.ForwardCost.from_record(r) for r in records]
    drawn = page.results_page(tmp_path / "results")
    assert "#### Forward costs: tiny-qwen2 target" in drawn and first["command"] in drawn
    assert "each line's bound at its own reading" in drawn
    # The host kind measured (family and model) goes with the figures: one slug spans several.
    assert first["cpu"] == platforms.detect().cpu_id and f"- CPU: {first['cpu']}" in drawn
    assert forwards.table(costs, first["bandwidth_gbs"]) in drawn
    # The printed table and the page's agree on every measured cell (the page's bandwidth is the
    # recorded one, rounded, so only the bound's columns may differ in the last digit).
    measured = forwards.table(costs).splitlines()[2]
    assert measured.rstrip("|") in printed
    # A second run appends to the first one's file (the file is this tool's rows, not the CLI's).
    assert forwards.main([*argv[:-4], "--m", "2", "--json", str(rows_file)]) == 0
    assert [r["m"] for r in results.read_records(rows_file)] == [1, 3, 2]
    # Each run is drawn: the page embeds a plot per run, named by its place in the file, and
    # writing the page writes them.
    drawn = page.results_page(tmp_path / "results")
    plots = [f"./some-machine/forwards-tiny-{run}.png" for run in (1, 2)]
    assert all(f"]({plot})" in drawn for plot in plots)
    page.write_results_page(tmp_path / "results")
    for plot in plots:
        assert (tmp_path / "results" / plot).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_llama_cpp_reference_is_a_line_of_the_table():
    from harness.base import llamacpp

    ref = llamacpp.Reference(
        tokens_per_s=40.0, tokens_per_s_std=1.0, threads=2, new_tokens=64, build="b1 (x)"
    )
    cost = forwards.reference_cost("target", ref)
    assert (cost.m, cost.ms, cost.bytes_read) == (1, 25.0, None)
    assert "| llama.cpp" in forwards.table([cost], 30.0)


def test_several_cache_lengths_are_timed_in_turn(tmp_path, capsys):
    """``--cache_tokens 8,40``: every (precision, kernels, M) at each length, a row each with its
    length, and the table gains a column for it."""
    from harness.settings import results

    rows_file = tmp_path / "forwards.jsonl"
    argv = ["--model_name", "tiny-qwen2", "--precisions", "fp32", "--kernels", "stock", "--m", "1,2"]
    argv += ["--cache_tokens", "8,40", "--repetitions", "1", "--json", str(rows_file)]
    assert forwards.main(argv) == 0
    records = results.read_records(rows_file)
    assert [(r["cache_tokens"], r["m"]) for r in records] == [(8, 1), (8, 2), (40, 1), (40, 2)]
    printed = capsys.readouterr().out
    assert "onto a 8, 40-token cache" in printed
    header, _, *lines = forwards.table([forwards.ForwardCost.from_record(r) for r in records]).splitlines()
    assert "cache" in header and [line.split("|")[4].strip() for line in lines] == ["8", "40"]
    # One length: no column (the table reads as it did).
    assert "cache" not in forwards.table([forwards.ForwardCost.from_record(records[0])]).splitlines()[0]


def test_the_bound_counts_the_kv_cache_the_forward_reads(tmp_path):
    """What a forward reads includes the keys and values it attends over: measured from the cache
    itself at each length (every layer's keys and values, one row per token, in the cache's dtype),
    so a long cache's bound is not the weights' alone. Rows recorded without it keep the weights'."""
    from harness.report import page
    from harness.settings import results

    rows_file = tmp_path / "results" / "some-machine" / "forwards" / "tiny.jsonl"
    argv = ["--model_name", "tiny-qwen2", "--precisions", "fp32", "--kernels", "stock", "--m", "1,3"]
    argv += ["--cache_tokens", "8,40", "--repetitions", "1", "--json", str(rows_file)]
    assert forwards.main(argv) == 0
    config = load_pair("tiny-qwen2", with_draft=False).target.config
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * dim * 4  # float32
    costs = [forwards.ForwardCost.from_record(r) for r in results.read_records(rows_file)]
    assert [(c.cache_tokens, c.m, c.cache_bytes) for c in costs] == [
        (n, m, per_token * (n + m)) for n in (8, 40) for m in (1, 3)
    ]
    assert all(c.bytes_total == c.bytes_read + c.cache_bytes for c in costs)
    # The table's read column at each length: the weights and that length's cache.
    lines = forwards.table(costs, bandwidth_gbs=1.0).splitlines()[2:]
    read = [float(line.strip("|").split("|")[-3]) for line in lines]
    assert read == [round(c.bytes_total / 1e9, 3) for c in costs if c.m == 1]
    longer, shorter = (c.bytes_total for c in costs[2::-2])
    assert longer - shorter == per_token * 32
    # A row recorded before the cache was measured: its bound is the weights' alone, and says so.
    record = results.read_records(rows_file)[0]
    old = {k: v for k, v in record.items() if k != "cache_bytes"}
    assert forwards.ForwardCost.from_record(old).bytes_total == record["bytes_read"]
    drawn = page.results_page(tmp_path / "results")
    assert "counts the KV cache" in drawn
    old_file = tmp_path / "results" / "some-machine" / "forwards" / "old.jsonl"
    results.append_row(old_file, {**old, "timestamp": "t0"})
    assert "the weights alone" in page.results_page(tmp_path / "results")
