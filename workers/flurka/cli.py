"""The ``flurka`` console script.

Subcommands live next to the code they drive and are imported only when used,
so ``flurka flops`` or ``flurka train`` work on a machine without Ray or MLflow
(the GPU box) while ``flurka tables`` still reaches the platform.
Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import gc
import importlib
import importlib.metadata
import os
import re
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

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


# -- SIGINT / SIGTERM: one line, exit 130 / 143 (one piece every long command shares) -----------

PROG: contextvars.ContextVar[str] = contextvars.ContextVar("flurka_prog", default="flurka")
"""The program name the user typed (``flurka theory``, ``python -m flurka.speed``), set by
:func:`run_reporting_errors` for the lines a command prints."""


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM under ``stopping_on_signals(raising=True)``: it unwinds as Ctrl-C does
    (``with`` blocks close, a transaction rolls back); its line is printed when it leaves the
    ``with`` block, and :func:`run_reporting_errors` returns its ``code``."""

    def __init__(self, stop: SignalStop):
        super().__init__(stop.name)
        self.stop = stop

    @property
    def code(self) -> int:
        return self.stop.code


class SignalStop:
    """What :func:`stopping_on_signals` yields. ``event`` is set by the first SIGINT or SIGTERM
    (``is_set()`` reads it, for a loop to poll between measurements), ``signum`` is that signal,
    ``code`` the exit status a shell shows for it (130 / 143), and ``line`` what the command's one
    line says about what it kept: a string, or a callable the command keeps current with its
    progress (a second signal prints it too, then exits at once)."""

    def __init__(self, prog: str, raising: bool):
        self.prog, self.raising = prog, raising
        self.event = threading.Event()
        self.signum: int | None = None
        self.line: str | Callable[[], str] = "stopped; nothing written"
        self._raised = False       # an Interrupted is unwinding the stack (raising mode)
        self._held: list[int] = []   # signals that came while held() (raising mode)
        self._holding = 0
        self._printed = False
        self._active = True         # its handlers are installed
        self._again_pending = False   # a signal deferred by _again is on its way

    def is_set(self) -> bool:
        return self.event.is_set()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum or signal.SIGINT).name

    @property
    def code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)

    def message(self) -> str:
        line = self.line() if callable(self.line) else self.line
        return f"{self.prog}: {self.name}: {one_line(line, bare=False)}"

    def finish(self, line: str | Callable[[], str] | None = None) -> int:
        """Print the one line (once; ``line`` replaces :attr:`line`) and return the exit status."""
        if line is not None:
            self.line = line
        if not self._printed:
            sys.stderr.write(self.message() + "\n")
            self._printed = True
            sys.stderr.flush()
        return self.code

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Raising mode: a signal that comes inside the block takes effect when it ends (a step that
        must not stop half done: an MLflow run logged whole); a second one still exits at once."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if not self._holding and self._held and not self._raised:
            self._raised = True
            raise Interrupted(self)

    def _exit_now(self) -> None:
        """The line (if not printed yet), and out with the stop's code, flushed, skipping whatever
        is left (a second signal: what the first was finishing, XLA work in flight included; the
        interpreter's teardown)."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if not self._printed:   # os.write: the main thread may be inside a print to stderr
            self._printed = True
            with contextlib.suppress(Exception):
                os.write(2, (self.message() + "\n").encode())
        os._exit(self.code)

    def _handle(self, signum: int, frame) -> None:
        again, self._again_pending = self._again_pending, False
        if self.signum is None:
            self.signum = signum
        if self.raising and not self._raised:   # the first (or a deferred one, delivered again)
            self.event.set()
            if self._holding:
                if self._held:
                    self._exit_now()
                self._held.append(signum)
                return
            if self._not_here(frame):
                self._again(signum)
                return
            self._raised = True
            raise Interrupted(self)
        if again:   # the deferred one, come after it was raised all the same: no second signal
            return
        if self.event.is_set():
            self._exit_now()
        self.event.set()

    def _not_here(self, frame) -> bool:
        """Whether an exception must not be raised at ``frame``: it would be swallowed ("Exception
        ignored in ..."; inside a gc callback, where JAX collects XLA garbage and a long C
        computation runs little other Python, or inside this class's own hook), or an import is
        under way (raised in Python code a C extension's set-up calls, nanobind aborts the
        process: exit 134)."""
        codes = {getattr(getattr(cb, "__func__", cb), "__code__", None) for cb in gc.callbacks}
        codes.add(SignalStop._unraisable.__code__)
        while frame is not None:
            if frame.f_code in codes or frame.f_code.co_filename.startswith("<frozen importlib"):
                return True
            frame = frame.f_back
        return False

    def _again(self, signum: int) -> None:
        """Deliver ``signum`` to this process again in a moment (from a thread: the code that
        would swallow the exception has returned by then), unless the block has ended."""
        def later():
            time.sleep(0.01)
            if self._active and not self._raised:
                os.kill(os.getpid(), signum)
            else:
                self._again_pending = False

        self._again_pending = True
        threading.Thread(target=later, daemon=True).start()

    def _unraisable(self, unraisable) -> None:
        """An Interrupted that was swallowed all the same (a ``__del__``, a weakref callback):
        the signal again, so the handler raises it once that code has returned."""
        exc = unraisable.exc_value
        if isinstance(exc, Interrupted) and exc.stop is self:
            self._raised = False
            self._again(exc.stop.signum or signal.SIGINT)
            return
        self._previous_hook(unraisable)


@contextlib.contextmanager
def stopping_on_signals(prog: str | None = None, *, raising: bool = False) -> Iterator[SignalStop]:
    """SIGINT and SIGTERM end a command cleanly: one line ``PROG: SIGINT: <what was kept>`` on
    stderr, exit 130 / 143, what the command writes either whole or not at all.

    Polling (JAX commands): the first signal only sets ``stop.event``; the command's loop polls it
    between measurements, keeps or drops what it has, and returns ``stop.finish()``. Nothing is
    raised from the handler: an exception raised inside JAX's gc callback is swallowed there, and
    an interpreter ending with XLA work in flight may crash. ``raising`` (pure-Python/SQL
    commands): the first signal raises :class:`Interrupted` (a KeyboardInterrupt) wherever the
    command is; its line is printed as it leaves this block, and :func:`run_reporting_errors`
    returns its code. Either way a second signal prints the same line and exits at once
    (``os._exit``). The previous handlers are restored on the way out (in the console script,
    once a stop fired, the process instead ends with its code: :func:`_end`); outside the main
    thread (where no handler can be set) the stop never fires."""
    stop = SignalStop(prog or PROG.get(), raising)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, stop._handle) for s in (signal.SIGINT, signal.SIGTERM)}
    stop._previous_hook, sys.unraisablehook = sys.unraisablehook, stop._unraisable
    try:
        yield stop
        if raising and stop.is_set() and not stop._raised:   # one that waited for an import to end
            stop._raised = True
            raise Interrupted(stop)
    except Interrupted as exc:
        if exc.stop is stop:
            stop.finish()
        raise
    finally:
        stop._active = False
        sys.unraisablehook = stop._previous_hook
        ending = stop.signum is not None and _CONSOLE   # the process ends: no other handler's turn
        for s, h in previous.items():
            signal.signal(s, (lambda *_: stop._exit_now()) if ending else signal.SIG_DFL if h is None else h)
        if ending:
            _STOPPED.append(stop)


_CONSOLE = False
"""Whether this process is the ``flurka`` console script (or ``python -m``): a command a signal
stopped then ends at once, its line printed (:func:`_end`)."""
_STOPPED: list[SignalStop] = []


def _end(code: int) -> int:
    """``code``; in the console script after a stop, the process's exit with it now: flushed,
    without the interpreter's teardown (a second or two with JAX loaded, during which a second
    signal found Python's default handlers and the exit status was the signal's, not 130 / 143)."""
    if _CONSOLE and _STOPPED:
        _STOPPED[-1]._exit_now()
    return code


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line (``PROG: error: …``, exit 2; :func:`one_line`), no
    usage block."""

    def error(self, message: str):  # noqa: D102 (argparse's hook)
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


@contextlib.contextmanager
def _starting(prog: str) -> Iterator[None]:
    """SIGINT / SIGTERM while a command's modules are imported (JAX's: seconds): the imports end
    whole, then one line and 130 / 143 (:class:`Interrupted`)."""
    with stopping_on_signals(prog, raising=True) as stop:
        stop.line = "stopped while starting; nothing done"
        yield


def main(argv: list[str] | None = None) -> int:
    global _CONSOLE
    _CONSOLE = _CONSOLE or argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _end(_main(argv))
    except Interrupted as stopped:   # its line printed
        return _end(stopped.code)


def _main(argv: list[str]) -> int:
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
            with _starting(f"flurka {name}"):
                command = importlib.import_module(module)
            command.add_arguments(parsers[name])
    args, extra = parser.parse_known_args(argv)
    if extra:   # argparse would name the top program; the subcommand's is the one the user typed
        parsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return run_reporting_errors(f"flurka {args.command}", SUBCOMMANDS[args.command][0], args)


def run_reporting_errors(prog: str, module: str, args: argparse.Namespace) -> int:
    """``module.run(args)``; bad input is one readable line ``PROG: error: …`` and exit status 2,
    not a traceback (FLURKA_DEBUG=1 shows the traceback). A command stopped by a signal
    (:func:`stopping_on_signals`) exits 130 / 143, its line printed; Ctrl-C in one without
    handlers of its own (or before they are set) is one line and 130."""
    token = PROG.set(prog)
    try:
        with _starting(prog):
            command = importlib.import_module(module)
        return int(command.run(args) or 0)
    except KeyboardInterrupt as stopped:   # Interrupted: its line printed (also as `python -m flurka.cli`'s copy)
        if isinstance(getattr(stopped, "code", None), int):
            return stopped.code
        print(f"{prog}: SIGINT: stopped", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as err:
        if os.environ.get("FLURKA_DEBUG"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not _stdout_reader_gone():    # a socket's, not the terminal's: a real error
            raise
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the interpreter's flush at exit stays quiet
        return 0                            # `… --list | head`: the reader had what it wanted
    finally:
        PROG.reset(token)


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll says POLLERR)."""
    try:
        poll = select.poll()
        poll.register(sys.__stdout__.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def module_main(prog: str, module: str, argv: list[str] | None = None) -> int:
    """The ``python -m`` entry of a subcommand module: the parser and error handling of
    ``flurka <subcommand>`` under another program name."""
    global _CONSOLE
    _CONSOLE = _CONSOLE or argv is None
    try:
        with _starting(prog):
            mod = importlib.import_module(module)
    except Interrupted as stopped:   # its line printed
        return _end(stopped.code)
    parser = OneLineParser(prog=prog, description=mod.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(parser)
    return _end(run_reporting_errors(prog, module, parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
