"""Does a row's result depend on how many rows are computed together? Measured per op.

``row_divergence`` forwards the last M tokens of a prompt once, and one at a time, and compares
every module's output rows; ``python -m harness.row_divergence`` prints the table for a registered
target at several precisions and kernels (the measurement behind ``harness.kernels.invariant``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.base.errors import HarnessError


@dataclass(frozen=True)
class OpDivergence:
    op: str  # module class name, e.g. "Linear", "Qwen2Attention", "Qwen2RMSNorm", or "logits"
    m: int  # tokens in the batched forward
    max_abs: float  # largest |batched row - one-token row| over all modules of the op
    # The same, over only the calls whose input rows were bit-identical in both runs: what the op
    # itself introduces rather than inherits from an earlier op. None: no call had equal inputs.
    introduced: float | None

    @property
    def exact(self) -> bool:
        return self.max_abs == 0.0


def _rows(t: object) -> torch.Tensor | None:
    t = t[0] if isinstance(t, tuple) and t else t
    if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.is_floating_point():
        return t.detach().float().reshape(-1, t.shape[-1])
    return None


def _cat(rows: list[torch.Tensor] | None) -> torch.Tensor | None:
    # Rows of a call whose width changes from call to call (a mask over the growing cache) are not
    # per-token rows: leave them out of the comparison.
    if not rows or len({r.shape[-1] for r in rows}) != 1:
        return None
    return torch.cat(rows)


def row_divergence(model: nn.Module, ids: list[int], m: int) -> list[OpDivergence]:
    """Forward the last ``m`` tokens of ``ids`` once (after a prefill of the rest) and one at a
    time, and compare, per op type, what the two compute for the same tokens.

    Every module's input and output rows are captured by forward hooks; an op is exact only if
    every module of that type gives bit-identical rows (the model's logits are reported as
    "logits"). Comparing inputs too tells where a difference starts (``introduced``).
    """
    from transformers import DynamicCache

    if not 1 <= m < len(ids):
        raise HarnessError(f"need 1 <= m < len(ids) (got m={m}, {len(ids)} ids)")
    prefix = torch.tensor([ids[:-m]])
    tail = torch.tensor([ids[-m:]])
    types = {name: type(mod).__name__ for name, mod in model.named_modules() if name}

    def run(chunks: list[torch.Tensor]) -> tuple[dict[str, tuple], torch.Tensor]:
        ins: dict[str, list[torch.Tensor]] = {}
        outs: dict[str, list[torch.Tensor]] = {}
        recording = False

        def hook(mod, args, kwargs, out, name):
            if not recording:
                return
            first = args[0] if args else kwargs.get("hidden_states", kwargs.get("input"))
            for store, value in ((ins, first), (outs, out)):
                rows = _rows(value)
                if rows is not None:
                    store.setdefault(name, []).append(rows)

        handles = [
            mod.register_forward_hook(
                lambda mod, args, kwargs, out, name=name: hook(mod, args, kwargs, out, name), with_kwargs=True
            )
            for name, mod in model.named_modules()
            if name
        ]
        cache = DynamicCache()
        logits = []
        try:
            with torch.inference_mode():
                model(prefix, past_key_values=cache, use_cache=True)
                recording = True
                for chunk in chunks:
                    logits.append(model(chunk, past_key_values=cache, use_cache=True).logits[0].float())
        finally:
            for h in handles:
                h.remove()
        both = {k: (_cat(ins.get(k)), _cat(v)) for k, v in outs.items()}
        return both, torch.cat(logits)

    batched, batched_logits = run([tail])
    single, single_logits = run([tail[:, i : i + 1] for i in range(m)])
    worst: dict[str, float] = {}
    introduced: dict[str, float] = {}
    for name, (b_in, b_out) in batched.items():
        if name not in single:
            continue
        s_in, s_out = single[name]
        if b_out is None or s_out is None or s_out.shape != b_out.shape:
            continue
        op, diff = types[name], float((b_out - s_out).abs().max())
        worst[op] = max(worst.get(op, 0.0), diff)
        if b_in is not None and s_in is not None and b_in.shape == s_in.shape and torch.equal(b_in, s_in):
            introduced[op] = max(introduced.get(op, 0.0), diff)
    worst["logits"] = float((batched_logits - single_logits).abs().max())
    return [OpDivergence(op, m, d, introduced.get(op)) for op, d in sorted(worst.items())]


def divergence_markdown(results: list[tuple[str, str, list[OpDivergence]]]) -> str:
    """One line per (precision, kernels, M): the largest row difference per op, "0" when exact;
    an op marked * started a difference (its inputs were identical in both runs)."""
    from tabulate import tabulate

    ops = sorted({d.op for _, _, report in results for d in report} - {"logits"}) + ["logits"]
    body = []
    for prec, kernels, report in results:
        by_op = {d.op: d for d in report}
        cells = []
        for op in ops:
            d = by_op.get(op)
            if d is None:
                cells.append("-")
            elif d.exact:
                cells.append("0")
            else:
                star = "*" if d.introduced else ""
                cells.append(f"{d.max_abs:.1e}{star}")
        body.append([prec, kernels, report[0].m if report else "-", *cells])
    return tabulate(
        body, headers=["precision", "kernels", "M", *ops], tablefmt="github", disable_numparse=True
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.row_divergence``: the per-op row-divergence table of a registered target."""
    import argparse

    from harness.base import tasks
    from harness.decoding import engines
    from harness.pairs import models
    from harness.settings import setup

    parser = argparse.ArgumentParser(prog="python -m harness.row_divergence", description=main.__doc__)
    parser.add_argument(
        "--model_name", default=models.DEFAULT_PAIR, help="registered pair (target is measured)"
    )
    parser.add_argument("--precisions", default="fp32,bf16,w8abf16,w4abf16,w8af32", help="comma-separated")
    parser.add_argument("--kernels", default="stock,invariant", help="comma-separated: stock, invariant")
    parser.add_argument("--m", default="2,6", help="comma-separated batch sizes M (tokens per forward)")
    parser.add_argument("--weights_dir", default=None, help="directory holding the weights (see README)")
    args = parser.parse_args(argv)
    text = tasks.decode_prompts("code")[0].text
    results = []
    for prec in args.precisions.split(","):
        for kernels in args.kernels.split(","):
            spec = models.get_pair(args.model_name)
            run = setup.resolve(spec, target_precision=prec, target_kernels=kernels, with_draft=False)
            pair = engines.load(spec, run, weights_dir=args.weights_dir)
            ids = list(pair.tokenizer(text)["input_ids"])
            for m in (int(x) for x in args.m.split(",")):
                results.append((prec, kernels, row_divergence(pair.target, ids, m)))
                print(divergence_markdown(results[-1:]).splitlines()[-1], flush=True)
            del pair
    print(divergence_markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
