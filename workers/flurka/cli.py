"""The ``flurka`` console script.

Subcommands live next to the code they drive and are imported only when used,
so ``flurka flops`` or ``flurka train`` work on a machine without Ray or MLflow
(the GPU box) while ``flurka tables`` still reaches the platform.
Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help). Later subcommands register here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "flops": ("flurka.attention.flops_cli", "forward FLOPs per mechanism and the paper's regime claims"),
    "train": ("flurka.training.cli", "train a benchmark config (JSON result with --json)"),
    "speed": ("flurka.speed.__main__", "step-time benchmarks of every mechanism (JSON; JAX only)"),
    "theory": ("flurka.speed.theory_cli", "approximation error (Theorem 1) and kernel-attention ranks as JSON for `flurka report --theory` (JAX only)"),
    "ingest": ("flurka.results.ingest_cli", "load speed-benchmark / sweep JSON files into the results database"),
    "report": ("flurka.reports.cli", "static HTML report of the paper's tables and figures (+ Markdown/LaTeX), optionally logged to MLflow"),
    "ui": ("flurka.tracking.cli", "open the MLflow UI of a sweep on 127.0.0.1"),
    "tables": ("flurka.results.cli", "print a paper table (Tables 1-5, speed) from the results database"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="flurka", description="FLuRKA attention and experiment platform.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv else None
    for name, (module, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the subcommand in use
            importlib.import_module(module).add_arguments(sp)
    args = parser.parse_args(argv)
    try:
        return int(importlib.import_module(SUBCOMMANDS[args.command][0]).run(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        # Bad input is one readable line, not a traceback (FLURKA_DEBUG=1 shows the traceback).
        if os.environ.get("FLURKA_DEBUG"):
            raise
        print(f"flurka {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
