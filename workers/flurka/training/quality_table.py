"""Quality table on the small benchmarks: every mechanism × {lra-listops-small, lra-image-small,
mlm-small, nmt-small, nmt-list-small}, over seeds; one JSON line per run (its config's metrics,
eval loss, seed, steps, wall time) to stdout.

    python -m flurka.training.quality_table [--benchmarks ...] [--mechanisms ...] [--steps N] \\
        [--seeds 0,1,2] [--control] [--set KEY=VALUE ...] > table.jsonl
    python -m flurka.training.quality_table --summarize table.jsonl

``--control`` also trains the no-attention control (Linformer at d_k = 1,
:data:`flurka.catalogue.mechanisms.CONTROL`) per seed: the task's floor. ``--summarize`` trains nothing: per
benchmark it prints the mechanisms' mean ± 95 % CI over seeds (n) of each task metric (accuracy
and exact match in percent, BLEU 0–100, perplexity) and of the eval loss, the floor row where the
control ran (each cell that does not clear its mean beyond the cell's CI saying "at floor") and,
with accuracy, its chance line (the eval set's majority class, "at chance" likewise); then each
FLuRKA variant paired against its constituents (Linformer and its kernel: performer, rnn, eva),
the constituents against each other, and every mechanism against the floor, over the seeds both
have (each table one family of tests): the difference, its CI, ttest_rel's p and Holm's adjusted p over the table's tests,
and the verdict, "tie" where that is not below 0.05 (:mod:`flurka.stats`). A run listed twice (a
rerun appended) counts once: the last.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterable

from flurka.catalogue.mechanisms import (COMPRESSED, CONTROL, CONTROL_LABEL, CONTROL_NAME, FLURKA, KERNELS, LOW_RANK,
                                         MECHANISMS, constituents)
from flurka.catalogue import metrics as metric_catalogue
from flurka.catalogue.metrics import lower_is_better
from flurka.configs import family_benchmarks, get_config, metric_label
from flurka.configs.overrides import parse_assignments
from flurka.stats import AT_CHANCE, AT_FLOOR, CHANCE_NOTE, in_family, mean_ci, paired
from flurka.training.api import run

BENCHMARKS = family_benchmarks("small")
FLOOR = CONTROL_LABEL   # the control's runs, in the tables' value dicts and pairs


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds wants integers separated by commas, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds is empty")
    return seeds


def train(args: argparse.Namespace) -> int:
    extra = parse_assignments(args.overrides or [])
    runs = [(mech, False) for mech in args.mechanisms] + ([(CONTROL[0], True)] if args.control else [])
    for bench in args.benchmarks:
        for mech, control in runs:
            for seed in args.seeds:
                over = {**extra, "model.attention": mech, "seed": seed}
                if control:
                    over["model.attention_options.d_k"] = CONTROL[1]
                if args.steps:
                    over["steps"] = args.steps
                config = get_config(bench, **over)
                head = {"benchmark": bench, "attention": mech, "control": control, "seed": seed}
                try:
                    r = run(config, progress=False)
                except Exception as exc:  # one broken mechanism must not lose the rest of the table
                    print(json.dumps({**head, "status": f"error: {exc}"[:300]}), flush=True)
                    continue
                final = r["final_metrics"]
                d_k = config.model.attention_options.get("d_k") if mech in COMPRESSED else None
                row = {**head, "status": r["status"], "d_k": d_k,
                       "metric": config.metrics[0], "value": final.get(config.metrics[0]),
                       "metrics": {m: final.get(m) for m in config.metrics if m in final},
                       "loss": final.get("loss"), "chance": final.get("majority_accuracy"),
                       "seed": r["seed"], "steps": r["steps"],
                       "wall_time_s": round(r["wall_time_s"], 1), "train_flops": r["train_flops"],
                       "overrides": {k: v for k, v in extra.items()}}
                print(json.dumps(row), flush=True)
                print(row, file=sys.stderr, flush=True)
    return 0


# -- --summarize --------------------------------------------------------------------------------

def read_runs(lines: Iterable[str]) -> list[dict]:
    """The ok runs of a JSONL file, one per (benchmark, attention, control, seed): the last listed."""
    runs: dict[tuple, dict] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("status") != "ok" or "seed" not in row:
            continue
        runs[(row["benchmark"], row["attention"], bool(row.get("control")), row["seed"])] = row
    return list(runs.values())


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _value(run: dict, metric: str) -> float | None:
    """A run's ``metric``: from its ``metrics`` (older files: ``value``, their first metric), or the
    eval ``loss``."""
    if metric == "loss":
        return run.get("loss")
    if metric in (run.get("metrics") or {}):
        return run["metrics"][metric]
    return run.get("value") if run.get("metric") == metric else None


def _values(runs: list[dict], metric: str) -> dict[str, dict[int, float]]:
    """{attention: {seed: value}} of the runs' ``metric`` (fractions in percent), finite ones only;
    the control's under :data:`FLOOR`."""
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        v = _value(r, metric)
        if _finite(v):
            out.setdefault(FLOOR if r.get("control") else r["attention"], {})[r["seed"]] = metric_catalogue.shown(metric, float(v))
    return out


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def _order(mechanisms) -> list[str]:
    return [m for m in MECHANISMS if m in set(mechanisms)] + sorted(set(mechanisms) - set(MECHANISMS))


def _paired_table(pairs, columns, title: str) -> str:
    """One family of paired tests per column: rows (a, b), per column the difference ± CI (n), p,
    Holm's p over the column's tests and the verdict."""
    family = {name: in_family([paired(values.get(a, {}), values.get(b, {}), names=(a, b)) for a, b in pairs])
              for _, name, values in columns}
    rows = []
    for i, (a, b) in enumerate(pairs):
        cells = []
        for _, name, values in columns:
            p = family[name][i]
            scale = mean_ci(list(values.get(a, {}).values())).mean   # the metric's digits, not the gap's
            cells += [p.format(metric_catalogue.decimals(name, scale)), p.winner(lower_is_better(name))]
        rows.append([a, b, *cells])
    header = ["", "vs"]
    for label, _, _ in columns:
        header += [f"{label} difference", "verdict"]
    return (f"\n{title} (difference ± 95 % CI (n), ttest_rel p, Holm-adjusted p over the column's tests; "
            "verdict: the better one, tie where the adjusted p is not below 0.05)\n" + _markdown(header, rows))


def summarize(runs: list[dict]) -> str:
    """Per benchmark: the mechanisms' task metrics and eval loss as mean ± CI (n), the floor and
    chance rows, then the paired comparisons (module docstring)."""
    out = []
    for bench in sorted({r["benchmark"] for r in runs}):
        part = [r for r in runs if r["benchmark"] == bench]
        metrics = list(dict.fromkeys(m for r in part for m in (r.get("metrics") or {r.get("metric", "value"): None})))
        columns = [(metric_label(m, bench), m, _values(part, m)) for m in metrics]
        columns.append(("eval loss", "loss", _values(part, "loss")))
        mechs = _order({r["attention"] for r in part if not r.get("control")})
        lines = [float(r["chance"]) * 100.0 for r in part if _finite(r.get("chance"))]
        chance = statistics.median(lines) if lines and "accuracy" in metrics else None
        floors = {name: mean_ci(list(values[FLOOR].values())) for _, name, values in columns if FLOOR in values}
        rows = []
        for m in [*mechs, *([FLOOR] if floors else [])]:
            cells = []
            for _, name, values in columns:
                est = mean_ci(list(values.get(m, {}).values()))
                marks = []
                if name == "accuracy" and chance is not None and est.n > 0 and not est.above(chance):
                    marks.append(AT_CHANCE)
                if m != FLOOR and name in floors and est.n > 0 and not est.clears(floors[name].mean,
                                                                                   lower_is_better(name)):
                    marks.append(AT_FLOOR)
                cells.append(", ".join([est.format(metric_catalogue.decimals(name, est.mean)), *marks]))
            rows.append([CONTROL_NAME if m == FLOOR else m, *cells])
        if chance is not None:
            rows.append(["chance", *[f"{chance:.1f}" if name == "accuracy" else "" for _, name, _ in columns]])
        better = "; ".join(f"{label}: {metric_catalogue.better(name)} is better"
                           for label, name, _ in columns)
        out.append(f"{bench}: mean ± 95 % CI over seeds (n); {better}\n")
        out.append(_markdown(["mechanism", *(label for label, _, _ in columns)], rows))
        if floors:
            out.append(f"{CONTROL_NAME}: the task's floor, trained like the rest; {AT_FLOOR}: a cell whose 95 % CI "
                       "does not clear its mean\n")
        if chance is not None:
            out.append(CHANCE_NOTE + "\n")
        pairs = [(v, c) for v in mechs if v in FLURKA for c in constituents(v).values() if c in mechs]
        if pairs:
            out.append(_paired_table(pairs, columns, "FLuRKA variants paired with their constituents over common "
                                                     "seeds, variant − constituent"))
        plain = [m for m in (LOW_RANK, *KERNELS) if m in mechs]
        pairs = [(a, b) for i, a in enumerate(plain) for b in plain[i + 1:]]
        if pairs:
            out.append(_paired_table(pairs, columns[:-1], "The constituents against each other over common seeds, "
                                                          "A − B"))
        if floors:
            out.append(_paired_table([(m, FLOOR) for m in mechs], columns[:-1],
                                     "Every mechanism against the floor (no attention) over common seeds, A − no attention"))
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
    p.add_argument("--control", action="store_true",
                   help=f"also train the no-attention control ({CONTROL_NAME}) per seed: the table's floor row")
    p.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE",
                   help="a config override for every run, as flurka train --set reads it (repeatable)")
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
