"""What one forward costs by M (tokens per forward): the numbers behind c and v.

Assisted decoding pays one draft forward per proposed token (M = 1) and one target forward over
K+1 tokens per step; plain decoding pays target forwards at M = 1. Whether assistance can pay on a
machine is mostly these costs (Leviathan et al.: c = draft / target at M = 1, v = target at K+1 /
target at M = 1), so they are measured directly, per precision and kernels, on a KV cache of a
realistic length. ``python -m harness.forwards`` prints the table the README holds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness import models
from harness.errors import HarnessError


@dataclass(frozen=True)
class ForwardCost:
    role: str  # "target" or "draft"
    precision: str
    kernels: str
    m: int
    ms: float  # median over the repetitions
    ms_min: float


def time_forwards(
    model: torch.nn.Module, ms: Sequence[int], cache_tokens: int = 200, repetitions: int = 5, seed: int = 0
) -> dict[int, tuple[float, float]]:
    """Median and best ms of one forward of M new tokens onto a ``cache_tokens`` KV cache, per M.

    Every repetition rebuilds the cache (a prefill, not timed) so each timed forward sees the
    same cache length; the first repetition warms up and is dropped."""
    from transformers import DynamicCache

    if cache_tokens < 1 or repetitions < 1 or any(m < 1 for m in ms):
        raise HarnessError("cache_tokens, repetitions and every M must be at least 1")
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prefix = torch.randint(100, min(vocab, 20000), (1, cache_tokens), generator=g)
    out: dict[int, tuple[float, float]] = {}
    with torch.inference_mode():
        for m in ms:
            times = []
            for _ in range(repetitions + 1):
                cache = DynamicCache()
                model(prefix, past_key_values=cache, use_cache=True)
                new = torch.randint(100, min(vocab, 20000), (1, m), generator=g)
                start = time.perf_counter()
                model(new, past_key_values=cache, use_cache=True)
                times.append((time.perf_counter() - start) * 1000)
            out[m] = (statistics.median(times[1:]), min(times[1:]))
    return out


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
) -> list[ForwardCost]:
    """Load the pair's ``role`` model once per (precision, kernels) and time its forwards by M."""
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
            pair = models.load_pair(name, weights_dir=weights_dir, **settings)
            model = getattr(pair, role)
            for m, (med, best) in time_forwards(model, ms, cache_tokens, repetitions).items():
                rows.append(ForwardCost(role, prec, kern, m, med, best))
            del pair, model
    return rows


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def table(rows: Sequence[ForwardCost]) -> str:
    """Markdown: one line per (role, precision, kernels), one column per M (median ms), and the
    cost of each M relative to M = 1 (what v is for K = M - 1)."""
    from tabulate import tabulate

    ms = sorted({r.m for r in rows})
    lines = {}
    for r in rows:
        lines.setdefault((r.role, r.precision, r.kernels), {})[r.m] = r.ms
    body = []
    for (role, prec, kern), by_m in lines.items():
        one = by_m.get(1)
        cells = [
            _ms(by_m[m]) + (f" ({by_m[m] / one:.2f})" if one and m != 1 else "") if m in by_m else "-"
            for m in ms
        ]
        body.append([role, prec, kern, *cells])
    return tabulate(
        body, headers=["model", "precision", "kernels", *[f"M={m}" for m in ms]], tablefmt="github"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.forwards``: median ms of one forward by M, per precision and kernels."""
    import argparse

    from harness import platforms, tasks

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
        "--cache_tokens", type=int, default=200, help="KV cache length before the timed forward"
    )
    parser.add_argument("--repetitions", type=int, default=5, help="timed forwards per M (median reported)")
    parser.add_argument("--weights_dir", default=None, help="directory holding the weights (see README)")
    args = parser.parse_args(argv)
    try:
        rows = measure(
            args.model_name,
            args.role,
            [p.strip() for p in args.precisions.split(",") if p.strip()],
            [k.strip() for k in args.kernels.split(",") if k.strip()],
            args.m,
            draft_vocab=args.draft_vocab,
            weights_dir=args.weights_dir,
            cache_tokens=args.cache_tokens,
            repetitions=args.repetitions,
        )
    except HarnessError as exc:
        parser.exit(2, f"error: {exc}\n")
    info = platforms.detect()
    print(
        f"{args.model_name} {args.role}: one forward of M tokens onto a {args.cache_tokens}-token cache, "
        f"median of {args.repetitions} (ms; in brackets: relative to M=1); {info.name}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}\n"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
