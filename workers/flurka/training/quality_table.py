"""Quality table on the small benchmarks: every mechanism × {lra-listops-small, lra-image-small,
mlm-small, nmt-small}, over seeds; one JSON line per run (final task metric, eval loss, seed,
steps, wall time) to stdout.

    python -m flurka.training.quality_table [--benchmarks ...] [--mechanisms ...] [--steps N] \\
        [--seeds 0,1,2] > table.jsonl
    python -m flurka.training.quality_table --summarize table.jsonl

``--summarize`` trains nothing: per benchmark it prints the mechanisms' mean ± 95 % CI over seeds
(n) of the task metric (accuracy in percent, BLEU 0–100, perplexity) and of the eval loss (with
accuracy, its chance line: the eval set's majority class, each cell that does not clear it beyond
its CI saying "at chance"), then
each FLuRKA variant paired against its constituents (Linformer and its kernel: performer, rnn,
eva) over the seeds both have: the difference, its CI, ttest_rel's p and the verdict, "tie" where
the CI holds 0 (:mod:`flurka.stats`). A run listed twice (a rerun appended) counts once: the last.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterable

from flurka.mechanisms import FLURKA, MECHANISMS, constituents
from flurka.stats import AT_CHANCE, CHANCE_NOTE, mean_ci, paired, significant_decimals

BENCHMARKS = ("lra-listops-small", "lra-image-small", "mlm-small", "nmt-small")
LOWER_IS_BETTER = ("perplexity", "loss")
PERCENT = ("accuracy", "f1", "matthews", "pearson", "spearman", "top5")   # fractions, shown ×100


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds wants integers separated by commas, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds is empty")
    return seeds


def train(args: argparse.Namespace) -> int:
    from flurka.configs import get_config
    from flurka.training import run

    for bench in args.benchmarks:
        for mech in args.mechanisms:
            for seed in args.seeds:
                over = {"attention": mech, "seed": seed}
                if args.steps:
                    over["steps"] = args.steps
                config = get_config(bench, **over)
                try:
                    r = run(config, progress=False)
                except Exception as exc:  # one broken mechanism must not lose the rest of the table
                    print(json.dumps({"benchmark": bench, "attention": mech, "seed": seed,
                                      "status": f"error: {exc}"[:300]}), flush=True)
                    continue
                final = r["final_metrics"]
                row = {"benchmark": bench, "attention": mech, "status": r["status"],
                       "metric": config.metrics[0], "value": final.get(config.metrics[0]),
                       "loss": final.get("loss"), "chance": final.get("majority_accuracy"),
                       "seed": r["seed"], "steps": r["steps"],
                       "wall_time_s": round(r["wall_time_s"], 1), "train_flops": r["train_flops"]}
                print(json.dumps(row), flush=True)
                print(row, file=sys.stderr, flush=True)
    return 0


# -- --summarize --------------------------------------------------------------------------------

def read_runs(lines: Iterable[str]) -> list[dict]:
    """The ok runs of a JSONL file, one per (benchmark, attention, seed): the last listed."""
    runs: dict[tuple, dict] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("status") != "ok" or "seed" not in row:
            continue
        runs[(row["benchmark"], row["attention"], row["seed"])] = row
    return list(runs.values())


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def metric_label(metric: str, benchmark: str) -> str:
    if metric in PERCENT:
        return f"{metric} (%)"
    if metric == "bleu":
        return "BLEU (char, 0–100)" if _char_bleu(benchmark) else "BLEU (0–100)"
    return "eval loss" if metric == "loss" else metric


def _char_bleu(benchmark: str) -> bool:
    try:
        from flurka.configs import get_config

        return get_config(benchmark).bleu_tokenize == "char"
    except ValueError:   # a benchmark this code no longer knows: say no more than "BLEU"
        return False


def _decimals(metric: str, value: float) -> int:
    return 1 if metric in PERCENT or metric == "bleu" else significant_decimals(value)


def _values(runs: list[dict], key: str, scale: float) -> dict[str, dict[int, float]]:
    """{attention: {seed: value}} of the runs' ``key`` (``value`` or ``loss``), finite ones only."""
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        if _finite(r.get(key)):
            out.setdefault(r["attention"], {})[r["seed"]] = float(r[key]) * scale
    return out


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def _order(mechanisms) -> list[str]:
    return [m for m in MECHANISMS if m in set(mechanisms)] + sorted(set(mechanisms) - set(MECHANISMS))


def summarize(runs: list[dict]) -> str:
    """Per benchmark: the mechanisms' task metric and eval loss as mean ± CI (n), then each
    FLuRKA variant paired against Linformer and its kernel, on both."""
    out = []
    for bench in sorted({r["benchmark"] for r in runs}):
        part = [r for r in runs if r["benchmark"] == bench]
        metric = next((r["metric"] for r in part if r.get("metric")), "value")
        columns = [(metric_label(metric, bench), metric, _values(part, "value", 100.0 if metric in PERCENT else 1.0)),
                   ("eval loss", "loss", _values(part, "loss", 1.0))]
        mechs = _order({r["attention"] for r in part})
        lines = [float(r["chance"]) * 100.0 for r in part if _finite(r.get("chance"))]
        chance = statistics.median(lines) if lines and metric == "accuracy" else None
        rows = []
        for m in mechs:
            cells = []
            for _, name, values in columns:
                est = mean_ci(list(values.get(m, {}).values()))
                at = name == metric and chance is not None and est.n > 0 and not est.above(chance)
                cells.append(est.format(_decimals(name, est.mean)) + (f", {AT_CHANCE}" if at else ""))
            rows.append([m, *cells])
        if chance is not None:
            rows.append(["chance", f"{chance:.1f}", ""])
        better = {name: "lower" if name in LOWER_IS_BETTER else "higher" for _, name, _ in columns}
        out.append(f"{bench}: mean ± 95 % CI over seeds (n); {columns[0][0]}: {better[metric]} is better, "
                   f"eval loss: lower is better\n")
        out.append(_markdown(["mechanism", *(label for label, _, _ in columns)], rows))
        if chance is not None:
            out.append(CHANCE_NOTE + "\n")
        pairs = [(v, c) for v in mechs if v in FLURKA for c in constituents(v).values() if c in mechs]
        if pairs:
            prow = []
            for v, c in pairs:
                cells = []
                for _, name, values in columns:
                    p = paired(values.get(v, {}), values.get(c, {}), names=(v, c))
                    scale = mean_ci(list(values.get(v, {}).values())).mean   # the metric's digits, not the gap's
                    cells += [p.format(_decimals(name, scale)), p.winner(name in LOWER_IS_BETTER)]
                prow.append([v, c, *cells])
            out.append("\nPaired over common seeds (variant − constituent: difference ± 95 % CI (n), ttest_rel p; "
                       "verdict: the better one, tie where the CI holds 0)\n")
            header = ["variant", "vs"]
            for label, _, _ in columns:
                header += [f"{label} difference", "verdict"]
            out.append(_markdown(header, prow))
        out.append("\n")
    return "".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flurka.training.quality_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS))
    p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    p.add_argument("--steps", type=int)
    p.add_argument("--seeds", type=_seeds, help="comma-separated seeds, each mechanism run once per seed "
                                                "(default: --seed)")
    p.add_argument("--seed", type=int, default=0, help="one seed (default %(default)s)")
    p.add_argument("--summarize", metavar="FILE.jsonl",
                   help="train nothing: print the per-benchmark table of a JSONL file this module wrote")
    args = p.parse_args(argv)
    if args.summarize:
        try:
            with open(args.summarize) as f:
                runs = read_runs(f)
        except (OSError, json.JSONDecodeError) as exc:
            print(f"quality_table: cannot read {args.summarize}: {exc}", file=sys.stderr)
            return 2
        if not runs:
            print(f"quality_table: {args.summarize} holds no ok runs", file=sys.stderr)
            return 1
        sys.stdout.write(summarize(runs))
        return 0
    args.seeds = args.seeds or [args.seed]
    return train(args)


__all__ = ["BENCHMARKS", "main", "read_runs", "summarize"]


if __name__ == "__main__":
    sys.exit(main())
