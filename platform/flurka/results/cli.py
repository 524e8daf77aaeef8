"""``flurka tables``: print one of the paper's tables from a results database.

    flurka tables --table uptraining        # the newest run dir's results.db (make sweep: runs/uptrain-small)
    flurka tables --db postgresql://me@db-host/flurka --table glue --format latex
    flurka tables --db runs/uptrain-small/results.db --table uptraining --metric bleu --benchmark nmt-small

Without ``--db`` the table is read from the results.db of the newest run dir under ``runs/``
(stderr says which); ``--db`` takes a URL or a SQLite file's path. A reading command: a missing
SQLite file is an error naming it, never created. What a table is built from defaults to what the
database holds (``--table uptraining``/``isoflops``: the benchmark with up-training trials / with
loss and FLOPs curves; ``--table lra``: the small tasks when only they are there), stderr saying
what was picked; a database holding nothing for the table is one line naming what it does hold.

Quality tables (uptraining, glue, lra, collective) show each cell as mean ± 95 % CI over seeds
(n); ``--format csv`` gives them as rounded numbers instead (per cell ``mean``, ``ci_low``,
``ci_high``, ``n`` columns; ``--table uptraining`` long, one row per cell with ``alpha`` a column).
``--table uptraining`` also prints Table 5's three observations evaluated on the data (markdown
and LaTeX; CSV is the table alone).

Exit codes: 0 printed; 1 nothing to build the table from or a bad option; 2 no database (none
given and no run dir holds one, or a missing SQLite file), or it cannot be reached, is no database
(a text file, a corrupt SQLite file) or is not at this code's schema (one line on stderr, never
the password); 130 / 143 stopped by SIGINT / SIGTERM (one line; nothing printed to stdout).
"""

from __future__ import annotations

import argparse
import copy
import sys

import sqlalchemy as sa

from flurka.cli import stopping_on_signals
from flurka.configs import get_config
from flurka.results import db, quality_tables, rundirs, speed_tables, tables
from flurka.results.models import CurvePoint, Sweep, Trial

TABLES = ("uptraining", "glue", "lra", "collective", "isoflops", "speed", "speedup", "floor", "targets")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, metavar="URL|PATH",
                        help="SQLAlchemy URL or a SQLite file's path (default: the results.db of the newest "
                             "run dir under runs/, e.g. runs/uptrain-small/results.db after make sweep)")
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
                             "trials on); isoflops: benchmark (default: the one with loss and train_flops curves, "
                             "nmt-wmt14-ende among several)")
    parser.add_argument("--agg", default="mean", choices=quality_tables.AGGS,
                        help="mean: best config's mean over seeds with its 95%% CI and n (default); best: best "
                             "single trial (n=1, no CI)")
    pool = parser.add_mutually_exclusive_group()
    pool.add_argument("--sweep", help="quality tables: this sweep (its id, or a name: the newest sweep of that name); "
                                      "default: the newest sweep holding the table's trials")
    pool.add_argument("--all-sweeps", action="store_true",
                      help="quality tables: pool every sweep in the database (a benchmark whose trials were set "
                           "up differently is refused)")
    parser.add_argument("--small", action="store_true",
                        help="lra: the CPU-size tasks (lra-*-small; the default when the database holds only those)")
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
    try:
        return get_config(benchmark).metrics[0]
    except ValueError:
        raise ValueError(f"unknown benchmark {benchmark!r}: pass --metric") from None


def _uptraining(engine, args: argparse.Namespace) -> dict:
    benchmark = args.benchmark or quality_tables.uptrained_benchmark(engine, sweep=args.sweep)
    return {"benchmark": benchmark, "metric": args.metric or _first_metric(benchmark), "agg": args.agg,
            "sweep": args.sweep}

# -- defaults: what the database holds -------------------------------------------------------------

PAPER_ISOFLOPS = "nmt-wmt14-ende"   # Table 1's benchmark, taken when it is among several with curves
METRIC_TABLES = {"glue": ("a GLUE task", quality_tables.GLUE_COLUMNS), "collective": ("a Table 4 benchmark",
                                                                             quality_tables.COLLECTIVE_COLUMNS)}


def _in_sweep(stmt: sa.Select, sweep: str | None) -> sa.Select:
    if sweep is None:
        return stmt
    return stmt.join(Sweep, Sweep.id == Trial.sweep_id).where(sa.or_(Sweep.external_id == sweep, Sweep.name == sweep))


def held_benchmarks(engine, sweep: str | None = None) -> dict[str, int]:
    """Benchmark -> number of ok trials the database (or ``sweep``) holds."""
    stmt = _in_sweep(sa.select(Trial.benchmark, sa.func.count()).where(Trial.status == "ok")
                     .group_by(Trial.benchmark), sweep)
    with engine.connect() as conn:
        return dict(conn.execute(stmt).all())


def holdings(held: dict[str, int], sweep: str | None = None) -> str:
    """What the database holds, in words: "the database holds nmt-small (27 ok trials)"."""
    where = f"sweep {sweep!r}" if sweep is not None else "the database"
    if not held:
        return f"{where} holds no ok trials"
    return f"{where} holds " + ", ".join(f"{b} ({n} ok trial{'' if n == 1 else 's'})" for b, n in sorted(held.items()))


def _isoflops_benchmark(engine, loss: str, sweep: str | None) -> tuple[str, str]:
    """The benchmark for Table 1 and why: the one with ``loss`` and ``train_flops`` curves (those
    with a full-attention trial to take the target from first), the paper's among several."""
    stmt = _in_sweep(sa.select(Trial.benchmark, CurvePoint.name).distinct()
                     .join(CurvePoint, CurvePoint.trial_id == Trial.id)
                     .where(Trial.status == "ok", CurvePoint.name.in_([loss, "train_flops"])), sweep)
    ref = _in_sweep(sa.select(Trial.benchmark).distinct().where(Trial.status == "ok", Trial.attention == "full"), sweep)
    with engine.connect() as conn:
        names: dict[str, set[str]] = {}
        for bench, name in conn.execute(stmt):
            names.setdefault(bench, set()).add(name)
        with_ref = set(conn.scalars(ref))
    curves = sorted(b for b, n in names.items() if n == {loss, "train_flops"})
    if not curves:
        raise tables.NoResults(f"no ok trials with {loss!r} and 'train_flops' curves; "
                               f"{holdings(held_benchmarks(engine, sweep), sweep)}")
    pool = [b for b in curves if b in with_ref] or curves
    if PAPER_ISOFLOPS in pool and len(pool) > 1:
        return PAPER_ISOFLOPS, f"the paper's, among {len(pool)} benchmarks with {loss} and train_flops curves"
    if len(pool) > 1:
        raise ValueError(f"{loss!r} and 'train_flops' curves on several benchmarks ({', '.join(pool)}): "
                         "pass --benchmark")
    return pool[0], f"the benchmark the database holds {loss} and train_flops curves on"


QUALITY = ("uptraining", "glue", "lra", "collective", "isoflops")


def _table_benchmarks(engine, args: argparse.Namespace) -> list[str] | None:
    """The benchmarks a quality table reads (None: any)."""
    if args.benchmark:
        return [args.benchmark]
    if args.table == "uptraining":
        return quality_tables.uptrained_benchmarks(engine)
    columns = {"glue": quality_tables.GLUE_COLUMNS, "collective": quality_tables.COLLECTIVE_COLUMNS,
               "lra": quality_tables.LRA_COLUMNS + quality_tables.LRA_SMALL_COLUMNS}.get(args.table)
    return None if columns is None else sorted({b for _, b, _ in columns})


def pick_sweep(engine, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The one sweep a quality table is read from, as its id, and a note where a choice was made:
    ``--sweep`` as an id, or a name (the newest sweep of that name), else the newest sweep holding
    ok trials on the table's benchmarks. Sweeps set up alike are pooled only with --all-sweeps:
    a table never averages one run of 8 steps with another of 2000 (quality_tables.MixedSetups).
    Raises ValueError (one line naming the sweeps held) for a --sweep that names none."""
    stmt = (sa.select(Sweep.external_id, Sweep.name, Sweep.created_at, Sweep.id).join(Trial, Trial.sweep_id == Sweep.id)
            .where(Trial.status == "ok").distinct().order_by(Sweep.created_at.desc(), Sweep.id.desc()))
    if args.sweep is None and (benchmarks := _table_benchmarks(engine, args)) is not None:
        stmt = stmt.where(Trial.benchmark.in_(benchmarks))
    with engine.connect() as conn:
        held = conn.execute(stmt).all()
    if args.sweep is None:
        if len(held) < 2:
            return None, None
        newest = held[0]
        return newest.external_id, (f"sweep {newest.external_id} ({newest.name!r}, {newest.created_at:%Y-%m-%d %H:%M}), "
                                    f"the newest of the {len(held)} sweeps holding these trials (--sweep ID|NAME "
                                    "for another, --all-sweeps to pool them)")
    if any(h.external_id == args.sweep for h in held):
        return args.sweep, None
    named = [h for h in held if h.name == args.sweep]
    if not named:
        listed = ", ".join(f"{h.external_id} ({h.name!r})" for h in held[:5]) + (", ..." if len(held) > 5 else "")
        raise ValueError(f"no sweep with id or name {args.sweep!r} holds ok trials; the database holds "
                         f"{listed or 'none'}")
    if len(named) == 1:
        return named[0].external_id, None
    return named[0].external_id, (f"sweep {named[0].external_id}, the newest of the {len(named)} sweeps named "
                                  f"{args.sweep!r} (--sweep ID for another, --all-sweeps to pool every sweep)")


def resolve_defaults(engine, args: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    """``args`` with what the table is built from filled in from what the database holds, and
    one note per choice made (for stderr). Raises NoResults (one line, naming what the database
    does hold) where nothing fits the table."""
    args, notes = copy.copy(args), []
    if args.table in QUALITY and not args.all_sweeps:
        args.sweep, note = pick_sweep(engine, args)
        notes += [note] if note else []
    if args.table == "uptraining" and not args.benchmark:
        try:
            args.benchmark = quality_tables.uptrained_benchmark(engine, sweep=args.sweep)
        except tables.NoResults as e:
            raise tables.NoResults(f"{e}; {holdings(held_benchmarks(engine, args.sweep), args.sweep)}") from None
        notes.append(f"uptraining: {args.benchmark} (the benchmark the database holds up-training trials on; "
                     "--benchmark to choose)")
    elif args.table == "isoflops" and not args.benchmark:
        args.benchmark, why = _isoflops_benchmark(engine, args.metric or "loss", args.sweep)
        notes.append(f"isoflops: {args.benchmark} ({why}; --benchmark to choose)")
    elif args.table == "lra":
        held = held_benchmarks(engine, args.sweep)
        full = {b for _, b, _ in quality_tables.LRA_COLUMNS}
        small = sorted({b for _, b, _ in quality_tables.LRA_SMALL_COLUMNS})
        if args.small and not held.keys() & set(small):
            raise tables.NoResults(f"no ok trials on the small LRA tasks ({', '.join(small)}); "
                                   f"{holdings(held, args.sweep)}")
        if not args.small and not held.keys() & full:
            if not held.keys() & set(small):
                raise tables.NoResults(f"no ok trials on an LRA task (lra-listops, …, lra-pathfinder, or "
                                       f"{', '.join(small)}); {holdings(held, args.sweep)}")
            args.small = True
            notes.append(f"lra: the small tasks ({', '.join(small)}), the only LRA trials the database holds "
                         "(--small)")
    elif args.table in METRIC_TABLES:
        what, columns = METRIC_TABLES[args.table]
        held = held_benchmarks(engine, args.sweep)
        wanted = sorted({b for _, b, _ in columns})
        if not held.keys() & set(wanted):
            raise tables.NoResults(f"no ok trials on {what} ({', '.join(wanted)}); {holdings(held, args.sweep)}")
    return args, notes


def database_url(args: argparse.Namespace, prog: str = "flurka tables") -> str | None:
    """``--db``, or the newest run dir's results.db (its line printed on stderr); None, its line
    printed, where none was given and no run dir holds one."""
    if args.db is not None:
        return args.db
    found = rundirs.newest_store(rundirs.RESULTS)
    if found is None:
        print(rundirs.missing_line(prog, rundirs.RESULTS, "--db URL|PATH"), file=sys.stderr)
        return None
    print(rundirs.picked_line(prog, found, "--db"), file=sys.stderr)
    return str(found)


def build(engine, args: argparse.Namespace):
    """The table ``args`` ask for; quality tables as text cells, or as rounded numbers for CSV."""
    quality = {"agg": args.agg, "sweep": args.sweep, "numbers": args.format == "csv"}
    bench = {"benchmark": args.benchmark} if args.benchmark else {}
    if args.table == "uptraining" and args.format == "csv":   # long: one row per cell, α a column
        return quality_tables.uptraining_long(engine, **_uptraining(engine, args))
    if args.table == "uptraining":
        return quality_tables.uptraining_table(engine, **_uptraining(engine, args))
    if args.table == "glue":
        return quality_tables.glue_table(engine, **quality)
    if args.table == "lra":
        return quality_tables.lra_table(engine, small=args.small, **quality)
    if args.table == "collective":
        return quality_tables.collective_table(engine, **quality)
    if args.table == "isoflops":
        return quality_tables.isoflops_table(engine, loss=args.metric or "loss", sweep=args.sweep,
                                     numbers=args.format == "csv", **bench)
    filters = {"device": args.device, "d_model": args.d_model, "scope": args.scope, "dtype": args.dtype,
               "align": args.align,
               "fused": args.fused, "fused_projections": args.fused_projections,
               "fused_ffn": args.fused_ffn, "pad_to": args.pad_to, "xla": args.xla}
    filters = {k: v for k, v in filters.items() if v is not None}
    if args.table == "floor":
        return speed_tables.floor_table(engine, **filters)
    if args.table == "targets":
        return speed_tables.targets_table(engine, **filters)
    speed = speed_tables.speed_table if args.table == "speed" else speed_tables.speedup_table
    return speed(engine, mode=args.mode, best=args.best, **filters)


def run(args: argparse.Namespace) -> int:
    with stopping_on_signals(raising=True) as stop:   # pure SQL and pandas: Ctrl-C unwinds it
        stop.line = "stopped before the table was printed"
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    url = database_url(args)
    if url is None:
        return 2
    try:
        engine = db.connect_existing(url)   # a reading command creates no database
        if args.upgrade:
            db.upgrade(engine)
        db.require_current(engine)
    except (db.DatabaseUnreachable, db.SchemaOutOfDate) as e:
        print(f"flurka tables: {e}", file=sys.stderr)
        return 2
    try:
        args, notes = resolve_defaults(engine, args)
        df = build(engine, args)
        observations = (quality_tables.uptraining_observations(engine, **_uptraining(engine, args))
                        if args.table == "uptraining" and args.format != "csv" else None)
    except ValueError as e:  # NoResults, ambiguous speed filters
        print(f"flurka tables: {e}", file=sys.stderr)
        return 1
    except db.database_errors() as e:  # a page corrupt past the schema (connect read that)
        print(f"flurka tables: {db.database_error(engine.url, e)}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    for note in notes:
        print(f"flurka tables: {note}", file=sys.stderr)
    sys.stdout.write(text(df, args.format, observations))
    return 0


def text(df, fmt: str, observations=None) -> str:
    """What ``flurka tables`` prints: the table (its title first and its note after, where it has
    them: lines in markdown, comments in LaTeX, nothing in CSV), then the observations block, if any."""
    comment = {"markdown": "", "latex": "% ", "csv": None}[fmt]
    title, note = df.attrs.get("title"), df.attrs.get("note")
    out = f"{comment}{title}\n\n" if title and comment is not None else ""
    out += tables.format_table(df, fmt)
    if note and comment is not None:
        out += f"\n{comment}{note}\n"
    if observations is not None:
        out += "\n" + quality_tables.format_observations(observations, fmt)
    return out
