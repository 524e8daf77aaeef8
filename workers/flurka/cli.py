"""The ``flurka`` console script.

Subcommands live next to the code they drive and are imported only when used,
so ``flurka flops`` or ``flurka train`` work on a machine without Ray or MLflow
(the GPU box) while ``flurka tables`` still reaches the platform.
Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import sys
from pathlib import Path

# name -> (module, one-line help). Later subcommands register here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "flops": ("flurka.theory.flops_cli", "forward FLOPs per mechanism and the paper's regime claims"),
    "train": ("flurka.training.cli", "train a benchmark config (JSON result with --json)"),
    "speed": ("flurka.speed.__main__", "step-time benchmarks of every mechanism (JSON; JAX only)"),
    "theory": ("flurka.theory.cli", "approximation error (Theorem 1) and kernel-attention ranks as JSON "
                                    "for `flurka report --theory` (JAX only)"),
    "sweep": ("flurka.sweeps.cli", "Ray Tune sweep of up-training alpha and d_k (what make sweep runs)"),
    "ingest": ("flurka.results.ingest_cli", "load speed-benchmark / theory / sweep JSON files into the results database"),
    "report": ("flurka.reports.cli", "static HTML report of the paper's tables and figures "
                                     "(+ Markdown/LaTeX), optionally logged to MLflow"),
    "ui": ("flurka.tracking.cli", "open the MLflow UI of a sweep on 127.0.0.1"),
    "tables": ("flurka.results.cli", "print a paper table (Tables 1-5, speed) from the results database"),
    "submit": ("flurka.source", "ray job submit that records the submitted commit and dirtiness for the job "
                                "(same arguments, --working-dir DIR among them)"),
}
PASSTHROUGH = {"submit"}   # their arguments are another tool's (ray job submit's), passed on as typed


def one_line(message: str, cut: int = 80, *, bare: bool = True) -> str:
    """``message`` on one line, what the user typed cut to ``cut`` characters: a quoted value and
    (``bare``) any run without spaces (a 100 KB ``--set`` or YAML key is not echoed whole)."""
    message = " ".join(str(message).split())
    for q in "'\"":   # a repr quotes with ' or, holding a ', with "; an apostrophe (step's) is no quote
        message = re.sub(rf"(?<!\w){q}([^{q}]{{{cut}}})[^{q}]+{q}(?!\w)", rf"{q}\1…{q}", message)
    return re.sub(rf"(\S{{{cut}}})\S+", r"\1…", message) if bare else message


# -- outputs, checked before any compute (one pass every command shares) ----------------------

def writable_dir(path: str | os.PathLike, what: str, *, named: str | os.PathLike | None = None) -> Path:
    """``path`` is a writable directory or can be made one (its nearest existing ancestor is a
    writable directory); creates nothing. Raises ValueError in one line naming ``what`` and the
    path the user gave (``named``, where ``path`` is the folder of a file)."""
    path = Path(path).expanduser()
    shown = path if named is None else named
    p = path.absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    if not p.is_dir():
        raise ValueError(one_line(f"{what} {shown}: {p} is not a directory", bare=False))
    if not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(one_line(f"{what} {shown}: {p} is not writable" + ("" if p == path.absolute()
                                                                            else " (cannot create it)"), bare=False))
    return path


def writable_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` can be written as a file: not a directory, in a directory :func:`writable_dir`
    accepts, and writable itself if it exists. Creates nothing."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(one_line(f"{what} {path} is a directory, not a file", bare=False))
    writable_dir(path.absolute().parent, what, named=path)
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(one_line(f"{what} {path} is not writable", bare=False))
    return path


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line (``PROG: error: …``, exit 2; :func:`one_line`), no
    usage block."""

    def error(self, message: str):  # noqa: D102 (argparse's hook)
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineParser(prog="flurka", description="FLuRKA attention and experiment platform.")
    parser.add_argument("--version", action="version", version=f"flurka {importlib.metadata.version('flurka')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    chosen, parsers = argv[0] if argv else None, {}
    if chosen in PASSTHROUGH and argv[1:2] not in (["-h"], ["--help"]):   # argparse would take them for its own
        return run_reporting_errors(f"flurka {chosen}", SUBCOMMANDS[chosen][0],
                                    argparse.Namespace(command=chosen, ray_args=argv[1:]))
    for name, (module, help_text) in SUBCOMMANDS.items():
        parsers[name] = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the subcommand in use
            importlib.import_module(module).add_arguments(parsers[name])
    args, extra = parser.parse_known_args(argv)
    if extra:   # argparse would name the top program; the subcommand's is the one the user typed
        parsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return run_reporting_errors(f"flurka {args.command}", SUBCOMMANDS[args.command][0], args)


def run_reporting_errors(prog: str, module: str, args: argparse.Namespace) -> int:
    """``module.run(args)``; bad input is one readable line ``PROG: error: …`` and exit status 2,
    not a traceback (FLURKA_DEBUG=1 shows the traceback)."""
    try:
        return int(importlib.import_module(module).run(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        if os.environ.get("FLURKA_DEBUG"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2


def module_main(prog: str, module: str, argv: list[str] | None = None) -> int:
    """The ``python -m`` entry of a subcommand module: the parser and error handling of
    ``flurka <subcommand>`` under another program name."""
    mod = importlib.import_module(module)
    parser = OneLineParser(prog=prog, description=mod.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(parser)
    return run_reporting_errors(prog, module, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
