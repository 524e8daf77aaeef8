"""The path between the commands, typed as a new user would after `make sweep` (issue 41's
"Defaults that do not meet"): each command finds what the sweep wrote or says why in one line,
with its exit code, and a reading command creates nothing.

Commands run through ``flurka.cli.main(argv)`` in a workspace directory (as the console script
does), or as a real ``flurka`` process where a wrong turn could start a server or a long job.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from testsupport import flurka, free_ports

from flurka.results import db, ingest_sweep, open_results

ROOT = Path(__file__).resolve().parents[2]
FLURKA = Path(sys.executable).parent / "flurka"
MAIN = "runs/uptrain-small"   # the uptrain-small config's run_dir
ENV = {"device": "cpu", "host": "laptop", "versions": {"jax": "0.10.2"}}




def flurka_process(argv: list[str], cwd: Path, env: dict | None = None, timeout: float = 120):
    return subprocess.run([str(FLURKA), *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its size and mtime: what "nothing created or changed" compares."""
    return {str(p.relative_to(root)): (p.is_dir(), p.stat().st_size if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _trial(key, attention, benchmark, metrics, *, seed=0, alpha=None, d_k=None, curve=True):
    points = [{"step": s, "loss": 2.0 - s / 1000 - (alpha or 0) / 10, "train_flops": s * 1e12} for s in (200, 400, 600)]
    return {"trial_key": key, "attention": attention, "benchmark": benchmark, "seed": seed, "status": "ok",
            "steps": 600, "alpha": alpha, "base": "linformer" if alpha is not None else None, "d_k": d_k,
            "num_features": 16 if attention.endswith("performer") else None, "train_flops": 6e14,
            "wall_time_s": 90.0, "metrics": metrics, "curve": points if curve else []}


def main_job_trials() -> list[dict]:
    """What `make sweep` records: nmt-small, Performer, Linformer at d_k 8 and 16 and the
    FLuRKA-Performer branches at α 37.5 % over 3 seeds (no full attention: ``full: false``)."""
    out = []
    for seed in (0, 1, 2):
        out.append(_trial(f"baseline/performer/s{seed}", "performer", "nmt-small", {"bleu": 88.0 + seed}, seed=seed))
        for d_k in (8, 16):
            out.append(_trial(f"baseline/linformer/s{seed}/dk{d_k}", "linformer", "nmt-small",
                              {"bleu": 96.0 + seed - 8 / d_k}, seed=seed, d_k=d_k))
            out.append(_trial(f"branch/flurka-performer/s{seed}/dk{d_k}/a0.375", "flurka-performer", "nmt-small",
                              {"bleu": 93.0 + seed + 4 / d_k}, seed=seed, d_k=d_k, alpha=0.375))
    return out


def write_run_dir(run_dir: Path, trials: list[dict], *, sweep_id: str, mtime: float | None = None) -> Path:
    """A run dir as a sweep leaves it: results.db with the trials, mlflow.db, sweep.json."""
    from flurka.sweeps.spec import SweepSpec, stored_dict, validate

    run_dir.mkdir(parents=True)
    path = run_dir / "results.db"
    engine = open_results(f"sqlite:///{path}")
    ingest_sweep(engine, {"sweep_id": sweep_id, "name": run_dir.name, "created_at": "2026-12-01T12:00:00+00:00",
                          "git_commit": "abc1234", "environment": ENV, "trials": trials})
    engine.dispose()
    (run_dir / "mlflow.db").write_bytes(b"")
    spec = validate(SweepSpec(benchmarks=("nmt-small",), variants=("flurka-performer",), alphas=(0.375,),
                              d_k=(8, 16), seeds=(0, 1, 2), steps=600, full=False, name=run_dir.name,
                              run_dir=str(run_dir)))
    (run_dir / "sweep.json").write_text(json.dumps(
        {"sweep_id": sweep_id, "created_at": "2026-12-01T12:00:00+00:00", "spec": stored_dict(spec), "masked": []},
        indent=2))
    if mtime is not None:
        for f in run_dir.iterdir():
            os.utime(f, (mtime, mtime))
    return run_dir


@pytest.fixture
def workspace(tmp_path) -> Path:
    """A checkout after `make sweep`: runs/uptrain-small (newest) and an older run dir."""
    ws = tmp_path / "ws"
    ws.mkdir()
    old = [_trial("baseline/rnn/s0", "rnn", "lra-listops-small", {"accuracy": 0.4})]
    write_run_dir(ws / "runs" / "older", old, sweep_id="older-1", mtime=1_700_000_000)
    write_run_dir(ws / MAIN, main_job_trials(), sweep_id="uptrain-small-1")
    return ws


@pytest.fixture
def empty(tmp_path) -> Path:
    """A fresh clone before any sweep: no runs/."""
    ws = tmp_path / "fresh"
    ws.mkdir()
    return ws


# -- 1. the defaults find what make sweep wrote ------------------------------------------------

def test_tables_without_db_reads_the_newest_run_dir(workspace):
    before = snapshot(workspace)
    code, out, err = flurka(["tables", "--table", "uptraining", "--format", "csv"], workspace)
    assert code == 0, err
    picked, benchmark = err.strip().splitlines()
    assert picked.startswith(f"flurka tables: using {MAIN}/results.db (the newest run dir under runs/")
    assert "--db to choose another" in picked
    assert benchmark.startswith("flurka tables: uptraining: nmt-small (the benchmark the database holds")
    assert out.startswith("variant,base,d_k,column,mechanism,alpha,") and ",37.5%,flurka-performer,0.375," in out
    assert snapshot(workspace) == before

    os.utime(workspace / "runs" / "older" / "results.db")   # the older run dir written to last
    code, out, err = flurka(["tables", "--table", "lra"], workspace)
    assert code == 0, err
    assert err.splitlines()[0].startswith("flurka tables: using runs/older/results.db")


def test_report_without_db_reads_the_newest_run_dir(workspace):
    code, out, err = flurka(["report", "--out", "report"], workspace)
    assert code == 0, err
    assert one_line(err).startswith(f"flurka report: using {MAIN}/results.db (the newest run dir")
    assert out.startswith("wrote ") and (workspace / "report" / "index.html").is_file()


def test_ui_without_run_dir_serves_the_newest_run_dir(workspace):
    code, out, err = flurka(["ui", "--dry-run"], workspace)
    assert code == 0, err
    assert one_line(err).startswith(f"flurka ui: using {MAIN}/mlflow.db (the newest run dir")
    assert f"--backend-store-uri sqlite:///{workspace / MAIN / 'mlflow.db'} " in out


# -- 2. a reading command never creates a database --------------------------------------------

@pytest.mark.parametrize("argv,store", [
    (["tables", "--table", "uptraining"], "results.db to read"),
    (["report", "--out", "report"], "results.db to read"),
    (["ingest", "speed.json"], "results.db to add to"),
    (["ui"], "mlflow.db to read"),
])
def test_no_run_dir_is_one_line_naming_make_sweep(empty, argv, store):
    if "speed.json" in argv:
        (empty / "speed.json").write_text("[]")
    before = snapshot(empty)
    code, out, err = flurka(argv, empty)
    assert code == 2 and out == ""
    line = one_line(err)
    assert line.startswith(f"flurka {argv[0]}: no {store}: no run dir under {empty / 'runs'}")
    assert f"`make sweep` writes {MAIN}/{store.split()[0]}" in line
    assert snapshot(empty) == before                     # no flurka-results.db, no runs/, no report/


@pytest.mark.parametrize("command", ["tables", "report"])
@pytest.mark.parametrize("spelling", ["path", "url"])
def test_missing_database_file_is_one_line_and_not_created(empty, command, spelling):
    missing = empty / "missing.db"
    db_arg = "missing.db" if spelling == "path" else f"sqlite:///{missing}"
    argv = ["tables", "--table", "glue", "--db", db_arg] if command == "tables" else \
        ["report", "--db", db_arg, "--out", "report"]
    code, out, err = flurka(argv, empty)
    assert code == 2 and out == ""
    line = one_line(err)
    assert line.startswith(f"flurka {command}: no results database at {missing}: `make sweep` writes")
    assert not missing.exists() and list(empty.iterdir()) == []


def test_tables_upgrade_does_not_create_a_missing_file_either(empty):
    code, _, err = flurka(["tables", "--table", "glue", "--db", "r.db", "--upgrade"], empty)
    assert code == 2 and "no results database at" in one_line(err) and list(empty.iterdir()) == []


# -- 3. a plain path is a SQLite file everywhere a database URL is taken ----------------------

def test_a_plain_path_is_accepted_as_sqlite(workspace):
    path = f"{MAIN}/results.db"
    code, out, err = flurka(["tables", "--db", path, "--table", "uptraining"], workspace)
    assert code == 0 and out.startswith("Up-training α, nmt-small"), err
    assert "using" not in err                             # --db given: nothing picked
    (workspace / "speed.json").write_text("[]")
    code, out, err = flurka(["ingest", "--db", "fresh.db", "speed.json"], workspace)
    assert code == 0 and (workspace / "fresh.db").is_file(), err   # a writer creates its file
    assert db.as_url("runs/x.db") == f"sqlite:///{Path('runs/x.db').resolve()}"
    assert db.as_url("~/r.db") == f"sqlite:///{Path.home() / 'r.db'}"
    assert db.as_url("postgresql://me@h/db") == "postgresql://me@h/db"
    with pytest.raises(db.DatabaseUnreachable, match="cannot parse database URL 'postgres:oops'"):
        db.connect("postgres:oops")                      # a malformed URL stays one, not a file


# -- 4. a table defaults to what the database holds ------------------------------------------

def test_lra_defaults_to_the_small_tasks_when_only_they_are_held(tmp_path):
    trials = [_trial(f"{m}/{b}/s{s}", m, b, {"accuracy": 0.5 + s / 100}, seed=s)
              for b in ("lra-listops-small", "lra-image-small") for m in ("rnn", "performer") for s in (0, 1)]
    run = write_run_dir(tmp_path / "runs" / "lra-small", trials, sweep_id="lra-small-1")
    code, out, err = flurka(["tables", "--db", str(run / "results.db"), "--table", "lra"], tmp_path)
    assert code == 0, err
    assert one_line(err) == ("flurka tables: lra: the small tasks (lra-image-small, lra-listops-small), "
                             "the only LRA trials the database holds (--small)")
    assert "ListOps (acc, %)" in out and "Image (acc, %)" in out


@pytest.mark.parametrize("table,needle", [
    ("lra", "no ok trials on an LRA task (lra-listops, …, lra-pathfinder, or lra-image-small, lra-listops-small)"),
    ("glue", "no ok trials on a GLUE task (glue-cola, "),
    ("collective", "no ok trials on a Table 4 benchmark (imagenet, mlm-wikitext103, nmt-wmt14-ende, "),
])
def test_a_table_the_database_cannot_fill_names_what_it_holds(workspace, table, needle):
    before = snapshot(workspace)
    code, out, err = flurka(["tables", "--db", f"{MAIN}/results.db", "--table", table], workspace)
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"flurka tables: {needle}")
    assert line.endswith("; the database holds nmt-small (15 ok trials)")
    assert snapshot(workspace) == before


def test_isoflops_defaults_to_the_benchmark_with_curves(workspace, tmp_path):
    code, out, err = flurka(["tables", "--db", f"{MAIN}/results.db", "--table", "isoflops"], workspace)
    # the main job has no full attention (full: false) to take Table 1's target loss from
    assert code == 1 and one_line(err) == "flurka tables: no 'full' trials on nmt-small to take the target loss from"

    trials = main_job_trials() + [_trial(f"baseline/full/s{s}", "full", "nmt-small", {"bleu": 97.0}, seed=s)
                                  for s in (0, 1)]
    run = write_run_dir(tmp_path / "runs" / "with-full", trials, sweep_id="with-full-1")
    code, out, err = flurka(["tables", "--db", str(run / "results.db"), "--table", "isoflops"], tmp_path)
    assert code == 0, err
    assert one_line(err) == ("flurka tables: isoflops: nmt-small (the benchmark the database holds loss and "
                             "train_flops curves on; --benchmark to choose)")
    assert "flurka-performer" in out and "EFLOPs" in out

    code, _, err = flurka(["tables", "--db", f"{MAIN}/results.db", "--table", "isoflops", "--metric", "bleu"],
                          workspace)
    assert code == 1 and one_line(err) == ("flurka tables: no ok trials with 'bleu' and 'train_flops' curves; "
                                           "the database holds nmt-small (15 ok trials)")


# -- 5. the run dir's own sweep.json ----------------------------------------------------------

def test_ingesting_the_run_dirs_sweep_json_says_what_it_is(workspace):
    before = snapshot(workspace)
    code, out, err = flurka(["ingest", f"{MAIN}/sweep.json"], workspace)
    assert code == 2 and out == ""
    line = one_line(err)
    assert line.startswith(f"flurka ingest: error: {MAIN}/sweep.json is sweep uptrain-small-1's spec")
    assert "not a results file" in line and "missing" not in line
    assert f"the sweep wrote its trials to {MAIN}/results.db already" in line
    assert f"`flurka tables --db {MAIN}/results.db --table uptraining`" in line
    assert snapshot(workspace) == before


# -- 6. lra-listops without its data ----------------------------------------------------------

def test_train_lra_listops_without_data_refuses_and_generates_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FLURKA_DATA_DIR"} | {"HOME": str(home)}
    proc = subprocess.run([str(FLURKA), "train", "--benchmark", "lra-listops", "--steps", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    line = one_line(proc.stderr)
    assert line.startswith("flurka train: error: lra-listops has no prepared data: training would first generate "
                           "LRA ListOps (100k trees")
    assert f"into {home / 'flurka_data' / 'lra_release' / 'listops-1000'}" in line
    assert "--generate-data" in line and "lra-listops-small" in line
    assert list(home.iterdir()) == []                    # no ~/flurka_data


def test_a_prepared_listops_dir_needs_no_flag(tmp_path):
    from flurka.data import generation_plan

    root = tmp_path / "lra_release" / "listops-1000"
    assert generation_plan("lra-listops", str(tmp_path)).endswith(f"into {root}")
    root.mkdir(parents=True)
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        (root / name).write_text("Source\tTarget\n")
    assert generation_plan("lra-listops", str(tmp_path)) is None
    assert generation_plan("lra-listops-small") is None and generation_plan("nmt-small") is None


# -- 7. flurka ui on a port it cannot serve ---------------------------------------------------

def test_ui_on_a_busy_or_impossible_port_is_one_line(workspace):
    port = free_ports(1)[0]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        proc = flurka_process(["ui", "--run-dir", MAIN, "--port", str(port)], workspace, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_line(proc.stderr) == (f"flurka ui: port {port} on 127.0.0.1 is in use (another `flurka ui`?): "
                                     "pass a free --port")
    for bad in ("99999", "-1", "0"):
        code, out, err = flurka(["ui", "--run-dir", MAIN, "--port", bad], workspace)
        assert code == 2 and out == ""
        assert one_line(err) == f"flurka ui: --port {bad} is not a TCP port (1-65535)"


# -- 8. LICENSE and CITATION.cff --------------------------------------------------------------

def test_license_matches_pyproject_and_citation_names_the_paper():
    license_text = (ROOT / "LICENSE").read_text()
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    assert license_text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text) > 11000

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "Apache-2.0" and cff["authors"]
    paper = cff["preferred-citation"]
    assert paper["title"] == "FLuRKA: Fast and accurate unified Low-Rank & Kernel Attention"
    tex = ROOT.parent / "shared" / "paper" / "flurka.tex"
    if tex.is_file():   # the authors are the paper's, in its order
        names = [f"{a['given-names']} {a['family-names']}" for a in paper["authors"]]
        block = tex.read_text().split(r"\author{", 1)[1].split(r"\begin{document}", 1)[0]
        positions = [block.index(n) for n in names]
        assert positions == sorted(positions) and block.count(r"\And") == len(names) - 1


def test_ui_takes_a_plain_path_to_the_store(workspace):
    code, out, err = flurka(["ui", "--backend-store-uri", f"{MAIN}/mlflow.db", "--dry-run"], workspace)
    assert code == 0 and err == "", err
    assert f"--backend-store-uri sqlite:///{workspace / MAIN / 'mlflow.db'} " in out
    code, out, err = flurka(["ui", "--backend-store-uri", "nowhere/mlflow.db", "--dry-run"], workspace)
    assert code == 2 and out == ""
    assert one_line(err).startswith(f"flurka ui: no MLflow store at {workspace / 'nowhere' / 'mlflow.db'}; "
                                    "`make sweep` writes runs/uptrain-small/mlflow.db")
