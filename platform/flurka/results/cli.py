"""``flurka tables``: print one of the paper's tables from a results database.

    flurka tables --db postgresql://me@db-host/flurka --table glue --format latex
    flurka tables --db sqlite:////abs/results.db --table uptraining --metric bleu --benchmark nmt-small

Quality tables (uptraining, glue, lra, collective) show each cell as mean ± 95 % CI over seeds
(n); ``--format csv`` gives them as rounded numbers instead (per cell ``mean``, ``ci_low``,
``ci_high``, ``n`` columns). ``--table uptraining`` also prints Table 5's three observations
evaluated on the data (markdown and LaTeX; CSV is the table alone).

Exit codes: 0 printed; 1 nothing to build the table from or a bad option; 2 the database cannot
be reached, is no database (a text file, a corrupt SQLite file) or is not at this code's schema
(one line on stderr, never the password).
"""

from __future__ import annotations

import argparse
import sys

from flurka.results import db, tables

TABLES = ("uptraining", "glue", "lra", "collective", "isoflops", "speed", "speedup", "floor", "targets")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=db.DEFAULT_URL, help="SQLAlchemy URL (default %(default)s)")
    parser.add_argument("--table", required=True, choices=TABLES,
                        help="uptraining (Table 5), glue (2), lra (3), collective (4), isoflops (1), speed, speedup, "
                             "floor (the GPU targets: each mechanism and execution against its floor at the "
                             "N-sweep's or flash comparison's largest N; narrow it to one card and scope with "
                             "--device, --scope, --dtype), targets (where each GPU target stands per card: the "
                             "worst mechanism or pair, each at its fastest execution)")
    parser.add_argument("--format", default="markdown", choices=tables.FORMATS)
    parser.add_argument("--metric", help="uptraining: metric (default: the benchmark's first, e.g. bleu, accuracy); "
                             "isoflops: curve loss name (default loss)")
    parser.add_argument("--benchmark", help="uptraining: benchmark (default: the one the database has up-training "
                             "trials on); isoflops: benchmark (default nmt-wmt14-ende)")
    parser.add_argument("--agg", default="mean", choices=tables.AGGS,
                        help="mean: best config's mean over seeds with its 95%% CI and n (default); best: best "
                             "single trial (n=1, no CI)")
    parser.add_argument("--sweep", help="only this sweep (external id or name)")
    parser.add_argument("--small", action="store_true", help="lra: the CPU-size tasks (lra-*-small)")
    parser.add_argument("--mode", default="train", choices=("forward", "train"), help="speed/speedup mode")
    parser.add_argument("--device", help="speed/speedup: device name contains this")
    parser.add_argument("--d-model", type=int, help="speed/speedup: only this d_model")
    parser.add_argument("--scope", choices=("layer", "model"), help="speed/speedup: one layer or the whole model")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), help="speed/speedup: compute dtype")
    parser.add_argument("--align", type=int,
                        help="speed/speedup: only runs with this aligned execution (1 = unaligned)")
    parser.add_argument("--fused", action=argparse.BooleanOptionalAction, default=None,
                        help="speed/speedup: only runs with (--fused) or without (--no-fused) the "
                             "Pallas query-side kernel")
    parser.add_argument("--fused-projections", action=argparse.BooleanOptionalAction, default=None,
                        help="speed/speedup: only runs with (--fused-projections) or without "
                             "(--no-fused-projections) W_Q and W_O in the query-side kernel")
    parser.add_argument("--fused-ffn", action=argparse.BooleanOptionalAction, default=None,
                        help="speed/speedup: only runs with (--fused-ffn) or without (--no-fused-ffn) "
                             "the blocks' fused residual + LayerNorm + FFN kernels")
    parser.add_argument("--pad-to", type=int,
                        help="speed/speedup: only runs whose batch was padded to a multiple of this "
                             "(1 = unpadded)")
    parser.add_argument("--best", action="store_true",
                        help="speed/speedup: each mechanism at its fastest measured execution "
                             "(aligned, fused, padded, XLA options), the speedup table saying which")
    parser.add_argument("--xla", metavar="NAME=VALUE,...",
                        help="speed/speedup: only runs compiled with these XLA options (as recorded: "
                             "name=value pairs, sorted, comma-separated; '' = XLA's defaults)")
    parser.add_argument("--upgrade", action="store_true", help="migrate the database to this code's schema first")


def _first_metric(benchmark: str) -> str:
    """The benchmark's headline metric (its config's first), as the sweep records it."""
    from flurka.configs import get_config

    try:
        return get_config(benchmark).metrics[0]
    except ValueError:
        raise ValueError(f"unknown benchmark {benchmark!r}: pass --metric") from None


def _uptraining(engine, args: argparse.Namespace) -> dict:
    benchmark = args.benchmark or tables.uptrained_benchmark(engine, sweep=args.sweep)
    return {"benchmark": benchmark, "metric": args.metric or _first_metric(benchmark), "agg": args.agg,
            "sweep": args.sweep}


def build(engine, args: argparse.Namespace):
    """The table ``args`` ask for; quality tables as text cells, or as rounded numbers for CSV."""
    quality = {"agg": args.agg, "sweep": args.sweep, "numbers": args.format == "csv"}
    bench = {"benchmark": args.benchmark} if args.benchmark else {}
    if args.table == "uptraining":
        return tables.uptraining_table(engine, numbers=args.format == "csv", **_uptraining(engine, args))
    if args.table == "glue":
        return tables.glue_table(engine, **quality)
    if args.table == "lra":
        return tables.lra_table(engine, small=args.small, **quality)
    if args.table == "collective":
        return tables.collective_table(engine, **quality)
    if args.table == "isoflops":
        return tables.isoflops_table(engine, loss=args.metric or "loss", sweep=args.sweep,
                                     numbers=args.format == "csv", **bench)
    filters = {"device": args.device, "d_model": args.d_model, "scope": args.scope, "dtype": args.dtype,
               "align": args.align,
               "fused": args.fused, "fused_projections": args.fused_projections,
               "fused_ffn": args.fused_ffn, "pad_to": args.pad_to, "xla": args.xla}
    filters = {k: v for k, v in filters.items() if v is not None}
    if args.table == "floor":
        return tables.floor_table(engine, **filters)
    if args.table == "targets":
        return tables.targets_table(engine, **filters)
    speed = tables.speed_table if args.table == "speed" else tables.speedup_table
    return speed(engine, mode=args.mode, best=args.best, **filters)


def run(args: argparse.Namespace) -> int:
    try:
        engine = db.connect(args.db)
        if args.upgrade:
            db.upgrade(engine)
        db.require_current(engine)
    except (db.DatabaseUnreachable, db.SchemaOutOfDate) as e:
        print(f"flurka tables: {e}", file=sys.stderr)
        return 2
    try:
        df = build(engine, args)
        observations = (tables.uptraining_observations(engine, **_uptraining(engine, args))
                        if args.table == "uptraining" and args.format != "csv" else None)
    except ValueError as e:  # NoResults, ambiguous speed filters
        print(f"flurka tables: {e}", file=sys.stderr)
        return 1
    except db.database_errors() as e:  # a page corrupt past the schema (connect read that)
        print(f"flurka tables: {db.database_error(engine.url, e)}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    sys.stdout.write(text(df, args.format, observations))
    return 0


def text(df, fmt: str, observations=None) -> str:
    """What ``flurka tables`` prints: the table (its title first, where it has one: a line in
    markdown, a comment in LaTeX, nothing in CSV), then the observations block, if any."""
    comment = {"markdown": "", "latex": "% ", "csv": None}[fmt]
    title = df.attrs.get("title")
    out = f"{comment}{title}\n\n" if title and comment is not None else ""
    out += tables.format_table(df, fmt)
    if observations is not None:
        out += "\n" + tables.format_observations(observations, fmt)
    return out
