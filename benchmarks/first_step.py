"""Time to the first training step of ``flurka train`` (issue 59), with a cold and a warm
compilation cache.

    python benchmarks/first_step.py --out benchmarks/results/cpu/DIR/first-step.json
    python benchmarks/first_step.py --runs 5 --source before=/tmp/base/workers --source after=workers \\
        --out ...      # two trees, interleaved run by run, each with its own caches

Each run is a fresh process running the issue's command (``--command``; default
``flurka train --benchmark lra-listops-small --attention flurka-rnn --steps 30 --json``) through
this file's ``--child`` mode, which calls ``flurka.cli.main`` as the console script does and notes
the wall-clock and CPU time (user + system, every thread of the process, from its start) at:
the imports done, each lap of the run's clock (``flurka.training.loop._Clock``: data, setup, ...)
and the return of the first training step (``_train_step``, which waits for that step's
results). Wall time is counted from just before the parent spawns the process, so interpreter
start-up is in it. Also per run: the whole run's wall and CPU time, the run's own ``time_split``
and ``compilation``, the XLA programs compiled (or loaded from the persistent cache) before the
first step, and the host's 1-minute load average before and after.

``cold``: every run with its own empty compilation cache (``--compilation-cache DIR``); ``warm``:
one cache per source, filled by an untimed first run, then every run loads from it. Runs alternate
between the sources (``--source NAME=WORKERS_DIR``, put first on ``PYTHONPATH``; default: this
checkout), so drift of the host's load falls on all of them alike. The JSON holds every run and,
per source and cache, the median and range (min, max) of each number; ``identical`` says whether
every run of every source printed the same ``history`` and ``final_metrics`` (a fixed seed: the
changes measured must not change a result). ``programs``: the names of the programs one untimed
run per source compiled, in order (``JAX_LOG_COMPILES``).

Wall times on a shared host depend on its load (recorded); CPU times much less so.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEMA = "flurka.first_step/1"
ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
COMMAND = ("train", "--benchmark", "lra-listops-small", "--attention", "flurka-rnn", "--steps", "30",
           "--json", "--no-progress")
T0_ENV, MARKS_ENV = "FLURKA_FIRST_STEP_T0", "FLURKA_FIRST_STEP_MARKS"
# the per-run numbers summarised (median, min, max)
SUMMARISED = ("first_step_wall_s", "first_step_cpu_s", "imports_wall_s", "imports_cpu_s",
              "run_wall_s", "run_cpu_s", "programs_before_first_step")


# ---- the child: one `flurka train`, its marks written to $FLURKA_FIRST_STEP_MARKS ------------------
def child(argv: list[str]) -> int:
    t0 = float(os.environ[T0_ENV])
    marks: list[tuple[str, float, float]] = []

    def mark(name: str) -> None:
        marks.append((name, time.time() - t0, time.process_time()))

    import flurka.cli
    import flurka.training.cli  # noqa: F401  (what `flurka train` imports before it runs)
    import jax.monitoring
    from flurka.training import compilation, loop

    mark("imports")
    programs = {"compiles": 0, "cache_hits": 0}
    first = {"done": False}

    def on_duration(event: str, duration: float, **_) -> None:
        if event == compilation.COMPILE_EVENT and not first["done"]:
            programs["compiles"] += 1

    def on_event(event: str, **_) -> None:
        if event == compilation.CACHE_HIT_EVENT and not first["done"]:
            programs["cache_hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    # The loop's own clock and its step, wrapped (private names: a rename fails here, loudly).
    lap, step = loop._Clock.lap, loop._train_step

    def noted_lap(self, part: str) -> None:
        lap(self, part)
        if not first["done"]:
            mark(f"lap {part}")

    def noted_step(*args, **kwargs):
        out = step(*args, **kwargs)
        if not first["done"]:
            mark("first step")
            first["done"] = True
        return out

    loop._Clock.lap, loop._train_step = noted_lap, noted_step
    try:
        return flurka.cli.main(argv)
    finally:
        Path(os.environ[MARKS_ENV]).write_text(json.dumps({"marks": marks, "programs": programs}))


# ---- the parent ------------------------------------------------------------------------------------
def _env(source: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_LOG_COMPILES")}
    if source:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(source).resolve()), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_once(command: list[str], source: str | None, cache: Path, scratch: Path) -> dict:
    """One timed run: the child's marks, the whole run's wall and CPU time, its JSON result."""
    marks_file = scratch / "marks.json"
    marks_file.unlink(missing_ok=True)
    env = {**_env(source), MARKS_ENV: str(marks_file)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--", *command,
            "--compilation-cache", str(cache)]
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    env[T0_ENV] = repr(t0)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"run failed ({out.returncode}): {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    noted = json.loads(marks_file.read_text())
    marks = {name: (w, c) for name, w, c in noted["marks"]}   # a part's last lap before the step
    phases, prev = [], (0.0, 0.0)
    for name, w, c in noted["marks"]:
        phases.append({"part": name, "wall_s": w - prev[0], "cpu_s": c - prev[1]})
        prev = (w, c)
    return {
        "first_step_wall_s": marks["first step"][0], "first_step_cpu_s": marks["first step"][1],
        "imports_wall_s": marks["imports"][0], "imports_cpu_s": marks["imports"][1],
        "phases_to_first_step": phases,
        "programs_before_first_step": noted["programs"]["compiles"],
        "cache_hits_before_first_step": noted["programs"]["cache_hits"],
        "run_wall_s": wall,
        "run_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "time_split": result["time_split"], "wall_time_s": result["wall_time_s"],
        "compilation": result["compilation"],
        "load_average_before_after": [load_before, os.getloadavg()[0]],
        "_result": {k: result[k] for k in ("history", "final_metrics")},
    }


def program_names(command: list[str], source: str | None, cache: Path) -> list[str]:
    """The programs one (untimed) run compiles or loads, in order, from JAX's compile log."""
    env = {**_env(source), "JAX_LOG_COMPILES": "1"}
    out = subprocess.run([sys.executable, "-m", "flurka.cli", *command, "--compilation-cache", str(cache)],
                         env=env, capture_output=True, text=True, cwd=REPO, check=True)
    return re.findall(r"Compiling jit\(([^)]*)\)", out.stderr)


def summary(runs: list[dict]) -> dict:
    return {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                  "max": max(r[key] for r in runs), "n": len(runs)} for key in SUMMARISED}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        sys.exit(child(argv[2:] if argv[1:2] == ["--"] else argv[1:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON document to write")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per source and cache (cold, warm)")
    parser.add_argument("--source", action="append", default=[], metavar="NAME=WORKERS_DIR",
                        help="a tree to time (its workers/ dir first on PYTHONPATH); repeatable; "
                             "default: this checkout")
    parser.add_argument("--command", default=" ".join(COMMAND), help="the flurka command line (no 'flurka')")
    parser.add_argument("--caches", default="cold,warm", help="which of cold, warm")
    args = parser.parse_args(argv)

    command = args.command.split()
    sources = dict(s.split("=", 1) for s in args.source) or {"this checkout": None}
    caches = [c for c in args.caches.split(",") if c]
    started = time.perf_counter()
    load_before = os.getloadavg()
    runs: list[dict] = []
    programs: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="first-step-") as tmp:
        tmp = Path(tmp)
        warm = {name: tmp / f"warm-{i}" for i, name in enumerate(sources)}
        for name, source in sources.items():                  # untimed: fills the warm cache
            if "warm" in caches:
                run_once(command, source, warm[name], tmp)
            programs[name] = program_names(command, source, warm[name] if "warm" in caches else tmp / "names")
        for i in range(args.runs):
            for cache in caches:
                for name, source in sources.items():
                    path = warm[name] if cache == "warm" else tmp / f"cold-{name}-{i}"
                    row = {"source": name, "cache": cache, "run": i, **run_once(command, source, path, tmp)}
                    if cache == "cold":
                        shutil.rmtree(path, ignore_errors=True)
                    runs.append(row)
                    print(f"{name:14s} {cache:4s} #{i}  first step {row['first_step_wall_s']:6.2f} s wall "
                          f"{row['first_step_cpu_s']:5.2f} s CPU (imports {row['imports_wall_s']:5.2f} / "
                          f"{row['imports_cpu_s']:4.2f}); run {row['run_wall_s']:6.2f} / {row['run_cpu_s']:5.2f}; "
                          f"{row['programs_before_first_step']} programs; load {row['load_average_before_after'][0]:.1f}",
                          flush=True)
    results = [r.pop("_result") for r in runs]
    # here, not at the top: a --child run of this file must import only what `flurka train` does
    from flurka.speed.runner import device_info, host_info, versions

    doc = {"schema": SCHEMA, "sweep": "first-step",
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": {**device_info(), **host_info()}, "versions": versions(extra=("ml_dtypes", "orbax-checkpoint")),
           "config": {"command": ["flurka", *command], "runs": args.runs, "caches": caches,
                      "sources": {k: v or str(REPO / "workers") for k, v in sources.items()},
                      "commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain"))},
           "settings": {"wall_s": time.perf_counter() - started,
                        "load_average_before_after": [load_before[0], os.getloadavg()[0]]},
           "identical": all(r == results[0] for r in results),
           "programs": programs,
           "summary": {name: {cache: summary([r for r in runs if r["source"] == name and r["cache"] == cache])
                              for cache in caches} for name in sources},
           "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for name in sources:
        for cache in caches:
            s = doc["summary"][name][cache]
            print(f"{name:14s} {cache:4s} first step: wall {s['first_step_wall_s']['median']:.2f} s "
                  f"({s['first_step_wall_s']['min']:.2f}-{s['first_step_wall_s']['max']:.2f}), CPU "
                  f"{s['first_step_cpu_s']['median']:.2f} s ({s['first_step_cpu_s']['min']:.2f}-"
                  f"{s['first_step_cpu_s']['max']:.2f}), n {s['first_step_wall_s']['n']}")
    print(f"identical results: {doc['identical']}; wrote {args.out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
