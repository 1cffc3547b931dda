"""What one forward costs by M (tokens per forward): the numbers behind c and v.

Assisted decoding pays one draft forward per proposed token (M = 1) and one target forward over
K+1 tokens per step; plain decoding pays target forwards at M = 1. Whether assistance can pay on a
machine is mostly these costs (Leviathan et al.: c = draft / target at M = 1, v = target at K+1 /
target at M = 1), so they are measured directly, per precision and kernels, on a KV cache of a
realistic length. ``python -m harness.forwards`` prints the table; with ``--json`` it also keeps
each cost as a row (with the machine, versions, bandwidth and command), from which the results page
draws the same table.
"""

from __future__ import annotations

import dataclasses
import itertools
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from harness.base import devices, llamacpp
from harness.base.errors import HarnessError
from harness.decoding import engines
from harness.kernels import llama_build
from harness.pairs import models
from harness.settings import setup
from harness.theory import timing
from harness.weights import packaged

# What every row this tool keeps holds: an earlier run's file is appended to, any other refused.
ROW_KEYS = ("pair", "platform", "role", "m", "ms")


# The precision a reference row (llama.cpp's own forwards of the same GGUF) is recorded under.
REFERENCE = "llama.cpp"


@dataclass(frozen=True)
class ForwardCost:
    role: str  # "target" or "draft"
    precision: str
    kernels: str
    m: int
    ms: float  # median over the repetitions
    ms_min: float
    bytes_read: int | None = None  # weights one forward streams (None: not a torch model)
    cache_tokens: int | None = None  # the KV cache's length before the forward
    # The host's read bandwidth (GB/s) the bound is taken at: read between this model's repetitions
    # (median), so the bound of the same minutes. None: the run's one reading stands for it.
    bound_gbs: float | None = None
    # Keys and values the forward attends over (the cache and its own rows, as the model holds them;
    # None: not measured, as in rows recorded before it was). Part of what the forward must read: at
    # 4,096 tokens the 1.5B target's float32 cache is about a quarter of its weights' bytes.
    cache_bytes: int | None = None

    @property
    def reference(self) -> bool:
        """Whether this is the reference's forward (``REFERENCE``), not one of the harness's own."""
        return self.precision == REFERENCE

    @property
    def bytes_total(self) -> int | None:
        """Everything the forward reads: its weights and, where measured, its cache."""
        return None if self.bytes_read is None else self.bytes_read + (self.cache_bytes or 0)

    def bound_ms(self, bandwidth_gbs: float | None = None) -> float | None:
        """The time reading ``bytes_total`` takes at this row's own bandwidth reading, else at
        ``bandwidth_gbs`` (the run's): the bound a one-token forward cannot beat; None without both."""
        read, gbs = self.bytes_total, self.bound_gbs or bandwidth_gbs
        return read / gbs / 1e6 if read and gbs else None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ForwardCost:
        return cls(**{f.name: record.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Timed:
    """One M's forwards as ``time_forwards`` timed them."""

    median: float  # ms
    best: float  # ms
    cache_bytes: int | None  # keys and values the forward attended over (``cache_bytes``)


def bytes_read(model: torch.nn.Module, m: int) -> int | None:
    """Bytes of weights one forward of ``m`` tokens reads: every parameter and buffer once (packed
    blocks as stored), the input embedding one row per token. The KV cache is the cache's own
    (``cache_bytes``)."""
    try:
        embedding = model.get_input_embeddings()
        output = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):  # an exported graph (ONNX Runtime): not torch weights
        return None
    # A tied output layer reads the whole shared matrix every forward.
    tied = getattr(output, "weight", None) is getattr(embedding, "weight", False)
    total, seen = 0, set()
    for module in model.modules():
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if module is embedding and not tied:
                total += m * t[0].numel() * t.element_size()
            else:
                total += t.numel() * t.element_size()
    return total


def cache_bytes(cache: Any) -> int | None:
    """Bytes of keys and values a cache holds now, as its layers hold them (a view's own extent, not
    the buffer behind it); None where the cache's layers hold no key and value tensors."""
    total = 0
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if not isinstance(t, torch.Tensor):
                return None
            total += t.numel() * t.element_size()
    return total or None


def bandwidth_reader(size_mib: int = 256) -> Callable[[], float]:
    """One reading of this host's memory read bandwidth as one-token decoding meets it (GB/s): a
    float32 sum over ``size_mib`` MiB (well past the last-level cache) on torch's threads. The
    buffer is numpy's, so it lies on huge pages where Linux offers them, as the k-quant blocks do
    (``resident_blocks``); it is made and paged in once, so each reading is only the sum."""
    x = torch.from_numpy(np.ones(size_mib * 2**20 // 4, dtype=np.float32))
    float(x.sum())

    def read() -> float:
        start = time.perf_counter()
        float(x.sum())
        return x.numel() * 4 / (time.perf_counter() - start) / 1e9

    return read


def read_bandwidth_gbs(size_mib: int = 1024, repetitions: int = 3) -> float:
    """This host's memory read bandwidth (GB/s): the best of ``repetitions`` readings over
    ``size_mib`` MiB (``bandwidth_reader``)."""
    read = bandwidth_reader(size_mib)
    return max(read() for _ in range(repetitions))


def time_forwards(
    model: torch.nn.Module,
    ms: Sequence[int],
    cache_tokens: int = 200,
    repetitions: int = 5,
    seed: int = 0,
    between: Callable[[], None] | None = None,
) -> dict[int, Timed]:
    """Median and best ms of one forward of M new tokens onto a ``cache_tokens`` KV cache, and the
    keys and values it attended over, per M.

    Each timed forward sees the same cache length: the cache is cropped back to the prefix after
    it (a prefill of a long cache costs far more than the forwards timed on it, so it is made once;
    a cache that cannot be cropped is rebuilt). The Ms are interleaved within each repetition, as
    the benchmark's arms are: timed one M after another, the first M measured a model still warming
    up (its one-token forward read 1.3x the two-token one) and every M a different phase of a host
    whose speed drifts. The first repetition warms up and is dropped. ``between`` runs after each
    repetition's forwards, outside the timings (``measure`` reads the host's bandwidth there)."""
    from transformers import DynamicCache

    if cache_tokens < 1 or repetitions < 1 or any(m < 1 for m in ms):
        raise HarnessError("cache_tokens, repetitions and every M must be at least 1")
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    device = devices.device_of(model)  # the CPU for an ONNX Runtime target (no torch parameters)
    prefix = torch.randint(100, min(vocab, 20000), (1, cache_tokens), generator=g).to(device)
    wait = timing.synchronized(model)  # None on the CPU; on a GPU each forward is timed to its end
    times: dict[int, list[float]] = {m: [] for m in ms}
    held: dict[int, int | None] = {}
    cache = None
    with torch.inference_mode():
        for _ in range(repetitions + 1):
            for m in ms:
                if cache is None:
                    cache = DynamicCache()
                    model(prefix, past_key_values=cache, use_cache=True)
                new = torch.randint(100, min(vocab, 20000), (1, m), generator=g).to(device)
                if wait is not None:
                    wait()
                start = time.perf_counter()
                model(new, past_key_values=cache, use_cache=True)
                if wait is not None:
                    wait()
                times[m].append((time.perf_counter() - start) * 1000)
                held[m] = cache_bytes(cache)
                if cache.get_seq_length() == cache_tokens + m:
                    cache.crop(-m)  # a count to remove, in transformers' 5.x spelling
                else:
                    cache = None
            if between is not None:
                between()
    return {m: Timed(statistics.median(t[1:]), min(t[1:]), held[m]) for m, t in times.items()}


def measure(
    name: str,
    role: str,
    precisions: Sequence[str],
    kernels: Sequence[str],
    ms: Sequence[int],
    *,
    draft_vocab: int | None = None,
    weights_dir: str | None = None,
    cache_tokens: int = 200,
    repetitions: int = 5,
    on_row: Callable[[ForwardCost], None] | None = None,
    bandwidth: Callable[[], float] | None = None,
) -> list[ForwardCost]:
    """Load the pair's ``role`` model once per (precision, kernels) and time its forwards by M onto
    a ``cache_tokens``-token cache; ``on_row`` sees each cost as soon as it is measured (so a long
    run keeps what it finished). ``bandwidth`` (a ``bandwidth_reader``) is read after each
    repetition, and each cost keeps the median of those readings: on a host whose read bandwidth
    moved between ~35 and ~55 GB/s from one process or minute to the next (AMD EPYC Zen 4, 2 cores), a
    bound read once before the model loaded put a one-token forward at 0.92x a bound it cannot
    beat."""
    if role not in ("target", "draft"):
        raise HarnessError(f"role must be target or draft, not {role!r}")
    rows = []
    for prec in precisions:
        for kern in kernels:
            if kern == "onnxruntime":
                # The target exported to ONNX Runtime (precision int4 or fp32, default settings):
                # "kernels" is then the runtime's.
                if role != "target":
                    raise HarnessError("--kernels onnxruntime times the target (--role target)")
                settings = {"target_precision": prec, "target_backend": "onnxruntime", "with_draft": False}
            elif role == "target":
                settings = {"target_precision": prec, "target_kernels": kern, "with_draft": False}
            else:
                settings = {"draft_precision": prec, "draft_kernels": kern, "draft_vocab": draft_vocab}
            spec = models.get_pair(name)
            pair = engines.load(spec, setup.resolve(spec, **settings), weights_dir=weights_dir)
            model = getattr(pair, role)
            readings: list[float] = []
            between = None if bandwidth is None else lambda kept=readings: kept.append(bandwidth())
            timed = time_forwards(model, ms, cache_tokens, repetitions, between=between)
            # The first repetition warms up and is dropped, its reading with it.
            gbs = round(statistics.median(readings[1:]), 2) if len(readings) > 1 else None
            for m, t in timed.items():
                rows.append(
                    ForwardCost(
                        role,
                        prec,
                        kern,
                        m,
                        t.median,
                        t.best,
                        bytes_read(model, m),
                        cache_tokens,
                        gbs,
                        t.cache_bytes,
                    )
                )
                if on_row is not None:
                    on_row(rows[-1])
            del pair, model
    return rows


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def table(rows: Sequence[ForwardCost], bandwidth_gbs: float | None = None) -> str:
    """Markdown: one line per (role, precision, kernels), one column per M (median ms), and the
    cost of each M relative to M = 1 (what v is for K = M - 1). With the host's read bandwidth
    (a line's own, read between its forwards, else ``bandwidth_gbs``), also what one token reads
    (its weights, and its KV cache where the row measured it), the time reading that takes at that
    bandwidth (the bound a one-token step cannot beat), and M = 1 over that bound."""
    from tabulate import tabulate

    ms = sorted({r.m for r in rows})
    # A column for the cache's length where the rows span several (the reference's too).
    caches = len({r.cache_tokens for r in rows if r.cache_tokens is not None}) > 1
    shown = bool(bandwidth_gbs) or any(r.bound_gbs for r in rows)
    lines: dict[tuple[str, str, str, int | None], dict[int, ForwardCost]] = {}
    for r in rows:
        lines.setdefault((r.role, r.precision, r.kernels, r.cache_tokens if caches else None), {})[r.m] = r
    body = []
    for (role, prec, kern, cache), by_m in lines.items():
        one = by_m[1].ms if 1 in by_m else None
        cells = [
            _ms(by_m[m].ms) + (f" ({by_m[m].ms / one:.2f})" if one and m != 1 else "") if m in by_m else "-"
            for m in ms
        ]
        bound = []
        if shown:
            read = by_m[1].bytes_total if 1 in by_m else None
            bound_ms = by_m[1].bound_ms(bandwidth_gbs) if 1 in by_m else None
            bound = [
                f"{read / 1e9:.3f}" if read else "-",
                _ms(bound_ms) if bound_ms else "-",
                f"{one / bound_ms:.2f}" if one and bound_ms else "-",
            ]
        body.append([role, prec, kern, *([str(cache)] if caches else []), *cells, *bound])
    extra = ["GB read (M=1)", "bound ms", "M=1 / bound"] if shown else []
    return tabulate(
        body,
        headers=["model", "precision", "kernels", *(["cache"] * caches), *[f"M={m}" for m in ms], *extra],
        tablefmt="github",
        disable_numparse=True,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.forwards``: median ms of one forward by M, per precision and kernels."""
    import argparse

    from harness.base import platforms, tasks
    from harness.settings import results

    parser = argparse.ArgumentParser(prog="python -m harness.forwards", description=main.__doc__)
    parser.add_argument("--model_name", default=models.DEFAULT_PAIR, help="registered pair")
    parser.add_argument("--role", choices=("target", "draft"), default="target", help="which model to time")
    parser.add_argument("--precisions", default="w8af32", help="comma-separated precisions")
    parser.add_argument(
        "--kernels",
        default="stock,invariant",
        help="comma-separated: stock, invariant, onnxruntime (the target exported to ONNX Runtime; "
        "precisions int4 or fp32 there)",
    )
    parser.add_argument(
        "--m", type=tasks.parse_int_list, default=(1, 2, 4, 6, 9), help="comma-separated tokens per forward"
    )
    parser.add_argument(
        "--draft_vocab", type=int, default=None, help="draft only: score this many token ids (0: all)"
    )
    parser.add_argument(
        "--cache_tokens",
        type=tasks.parse_int_list,
        default=(200,),
        help="comma-separated KV cache lengths before the timed forward (each timed in turn, with "
        "llama.cpp's plain decoding onto a cache of that length where --llama-bench is given)",
    )
    parser.add_argument("--repetitions", type=int, default=5, help="timed forwards per M (median reported)")
    parser.add_argument("--weights_dir", default=None, help="directory holding the weights (see README)")
    parser.add_argument(
        "--json",
        default=None,
        help="also append each cost as a JSON row to this file (the results page reads "
        "results/<machine>/forwards/*.jsonl)",
    )
    parser.add_argument(
        "--llama-bench",
        "--llama_bench",
        dest="llama_bench",
        default=None,
        help="llama.cpp's llama-bench binary: also time its plain decoding of the same GGUF, and its "
        f"forward of each M > 1 tokens at once (or set {llamacpp.ENV})",
    )
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    info = platforms.detect()
    reader = bandwidth_reader()
    bandwidth = max(reader() for _ in range(3))  # before anything loads; each model reads its own
    context = {
        "pair": args.model_name,
        "platform": info.name,
        # The platform slug names a CPU model and its core count; hosts under one slug (AMD Zen 4
        # and Zen 5 both read "AMD EPYC") are bound in different places, so the row names its kind.
        "cpu": info.cpu_id,
        "threads": torch.get_num_threads(),
        "repetitions": args.repetitions,
        "bandwidth_gbs": round(bandwidth, 2),
        "versions": platforms.library_versions(),
        "command": shlex.join(["python", "-m", "harness.forwards", *given]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    try:
        models.get_pair(args.model_name)
        model, gguf = gguf_of(args.model_name, args.role)
        bench_binary = llama_build.reference_binary(args.llama_bench, gguf, packaged.cache_root())
        if args.json:
            results.check_rows_path(Path(args.json), keys=ROW_KEYS)

        def keep(cost: ForwardCost) -> None:
            if args.json:
                results.append_row(args.json, {**context, **asdict(cost)})

        def run(cache_tokens: int) -> list[ForwardCost]:
            return measure(
                args.model_name,
                args.role,
                [p.strip() for p in args.precisions.split(",") if p.strip()],
                [k.strip() for k in args.kernels.split(",") if k.strip()],
                args.m,
                draft_vocab=args.draft_vocab,
                weights_dir=args.weights_dir,
                cache_tokens=cache_tokens,
                repetitions=args.repetitions,
                on_row=keep,
                bandwidth=reader,
            )

        rows: list[ForwardCost] = []
        lines: list[str] = []
        # One cache length after another, llama.cpp's decoding onto the same length around each.
        for cache_tokens in tqdm(args.cache_tokens, desc="cache lengths", disable=len(args.cache_tokens) < 2):
            done, ref, line = llamacpp.around(
                bench_binary,
                gguf,
                model,
                lambda n=cache_tokens: run(n),
                threads=torch.get_num_threads(),
                depth=cache_tokens,
            )
            rows += done
            lines.append(line)
            if ref is not None:
                first = dataclasses.replace(reference_cost(args.role, ref), cache_tokens=cache_tokens)
                batches = reference_batches(bench_binary, gguf, ref, args.role, args.m, cache_tokens)
                try:  # each cost kept as soon as it is measured (the batches are measured lazily)
                    for cost in itertools.chain([first], batches):
                        rows.append(cost)
                        if args.json:
                            results.append_row(args.json, {**context, **asdict(cost), "llama_cpp": line})
                except HarnessError as exc:  # the harness's rows stand without llama.cpp's batches
                    lines.append(f"llama.cpp's batches of M tokens: not measured ({exc})")
    except HarnessError as exc:
        parser.exit(2, f"error: {exc}\n")
    lengths = ", ".join(str(n) for n in args.cache_tokens)
    print(
        f"{args.model_name} {args.role}: one forward of M tokens onto a {lengths}-token cache, "
        f"median of {args.repetitions} (ms; in brackets: relative to M=1); {info.name}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; read bandwidth {bandwidth:.1f} GB/s "
        "before loading (the bound: each line's own, read between its forwards)\n"
    )
    print(table(rows, bandwidth))
    for line in dict.fromkeys(lines):
        print(line)
    return 0


def gguf_of(name: str, role: str) -> tuple[str, Path | None]:
    """The pair's ``role`` model and its GGUF file (None: it has none here), for llama.cpp."""
    pair = models.get_pair(name)
    spec = pair.target if role == "target" else pair.draft
    return spec.name, models.gguf_file(spec, None)


def reference_batches(
    binary: Path, gguf: Path, ref: llamacpp.Reference, role: str, ms: Sequence[int], cache_tokens: int
) -> Iterator[ForwardCost]:
    """llama.cpp's forward of each M > 1 tokens at once onto the same cache (``llamacpp.batch_ms``),
    as the reference's line continues: what a verification of M - 1 drafted tokens costs it, so
    both verifications' growth with M and with the cache read side by side."""
    for m in sorted({m for m in ms if m > 1}):
        t = llamacpp.batch_ms(binary, gguf, rows=m, threads=ref.threads, depth=cache_tokens)
        yield ForwardCost(role, REFERENCE, ref.build, m, t, t, None, cache_tokens)


def reference_cost(role: str, ref: llamacpp.Reference) -> ForwardCost:
    """llama.cpp's time per token as a line of the table (M = 1, onto a cache of the length it was
    measured at; its time includes sampling), so its plain decoding stands beside the harness's
    one-token forward; the mean of its runs just before and just after the harness's
    (``llamacpp.around``)."""
    return ForwardCost(role, REFERENCE, ref.build, 1, ref.ms_per_token, ref.ms_per_token, None)


if __name__ == "__main__":
    raise SystemExit(main())
