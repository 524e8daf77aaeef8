"""A realistic synthetic results database for the report tests, built through the real ingestion
API: one sweep record (every paper benchmark, up-training α grid, seeds, loss/FLOPs curves), four
``flurka.speed`` documents (n-sweep, dk-sweep, dmodel-sweep at layer scope, flash-compare at model
scope) whose points come from ``flurka.speed.configs`` and whose FLOPs come from the real FLOP
model, and a theory file in the format ``flurka.reports.sources`` documents.

Numbers are synthetic but shaped like the paper's (FLuRKA between its constituents, full attention
OOM at long N, step time ∝ FLOPs / device rate), so every figure has something to draw.

``main_job`` is the other shape a report meets: the main job's database alone (``make sweep``:
nmt-small, three seeds, two d_k, FLuRKA α branches forked from the Linformer baseline, every
trial with its loss / train_flops curve), so most sections have nothing to show.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from flurka.results import ingest_file, ingest_sweep, open_results
from flurka.results.quality_tables import COLLECTIVE_COLUMNS, GLUE_COLUMNS, LRA_COLUMNS, LRA_SMALL_COLUMNS

DEVICE = "NVIDIA H100 80GB HBM3"
MECHS = ("full", "flash", "linformer", "performer", "rnn", "eva", "flurka-performer", "flurka-rnn", "flurka-eva")
TRAINED = tuple(m for m in MECHS if m != "flash")
QUALITY = {"full": 0.0, "linformer": -0.04, "performer": -0.03, "rnn": -0.06, "eva": -0.01,
           "flurka-performer": -0.025, "flurka-rnn": -0.045, "flurka-eva": -0.008}
ALPHAS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
# The LRA tasks' chance lines (their majority class's share of the eval set; text, retrieval and
# pathfinder are binary), which every classification trial records beside its accuracy.
CHANCE = {"lra-listops": 0.17, "lra-text": 0.5, "lra-retrieval": 0.5, "lra-image": 0.1, "lra-pathfinder": 0.5,
          "lra-listops-small": 0.139, "lra-image-small": 0.117}


def _trial(key, attention, benchmark, metrics, *, seed=0, alpha=None, d_k=None, curve=None):
    return {"trial_key": key, "attention": attention, "benchmark": benchmark, "seed": seed, "status": "ok",
            "steps": 1000, "alpha": alpha, "base": "linformer" if alpha is not None else None,
            "d_k": d_k if (attention == "linformer" or attention.startswith("flurka")) else None,
            "num_features": 64 if attention.endswith("performer") else None, "train_flops": 2e18,
            "wall_time_s": 600.0, "metrics": metrics, "curve": curve or []}


def sweep_record(rng: np.random.Generator) -> dict:
    trials = []
    columns = {(b, m) for _, b, m in GLUE_COLUMNS + LRA_COLUMNS + LRA_SMALL_COLUMNS + COLLECTIVE_COLUMNS}
    base = {"bleu": 27.0, "perplexity": 5.5}
    for (bench, metric) in sorted(columns):
        for mech in TRAINED:
            for seed in (0, 1):
                q = QUALITY[mech] + rng.normal(0, 0.005)
                if metric == "bleu":
                    v = base["bleu"] * (1 + q)
                elif metric == "perplexity":
                    v = base["perplexity"] * (1 - 2 * q)
                else:
                    v = float(np.clip(0.75 + q + rng.normal(0, 0.01), -1, 1))
                metrics = {metric: v, **({"majority_accuracy": CHANCE[bench]} if bench in CHANCE else {})}
                trials.append(_trial(f"{bench}-{metric}-{mech}-{seed}", mech, bench, metrics, seed=seed, d_k=64))
    # Merge the metrics of one (benchmark, mechanism, seed) into one trial (GLUE has two per task).
    merged: dict[tuple, dict] = {}
    for t in trials:
        k = (t["benchmark"], t["attention"], t["seed"])
        if k in merged:
            merged[k]["metrics"].update(t["metrics"])
        else:
            merged[k] = {**t, "trial_key": f"{k[0]}-{k[1]}-{k[2]}"}
    trials = list(merged.values())
    # Table 5 and Table 1: up-trained FLuRKA on En-De with loss / train_flops curves.
    for mech in ("flurka-performer", "flurka-rnn", "flurka-eva"):
        for alpha in ALPHAS:
            for seed in (0, 1):
                bleu = 27.0 * (1 + QUALITY[mech] + 0.01 * np.sin(alpha * 3) + rng.normal(0, 0.002))
                trials.append(_trial(f"up-{mech}-{alpha}-{seed}", mech, "nmt-wmt14-ende", {"bleu": bleu},
                                     seed=seed, alpha=alpha, d_k=64))
    # FLuRKA's steps are cheaper and it ends below full attention's loss; Linformer never gets there.
    for mech, speed, floor in (("full", 1.0, 1.40), ("linformer", 1.8, 1.55), ("flurka-performer", 2.6, 1.38),
                               ("flurka-eva", 2.2, 1.36)):
        steps = np.arange(1, 21)
        loss = floor + 6.0 * np.exp(-steps / 5.0)
        curve = [{"step": int(s) * 100, "loss": float(l), "train_flops": float(s * 1e17 / speed)}
                 for s, l in zip(steps, loss)]
        trials.append(_trial(f"curve-{mech}", mech, "nmt-wmt14-ende", {"loss": float(loss[-1])}, d_k=64, curve=curve))
    return {"sweep_id": "report-test-sweep", "name": "paper reproduction", "created_at": "2025-01-02T03:04:05+00:00",
            "git_commit": "abc1234", "environment": {"device": DEVICE, "host": "gpu-7", "versions": {"jax": "0.11.0"}},
            "trials": trials}


def speed_document(sweep: str, rng: np.random.Generator, *, scopes=None) -> dict:
    """A ``flurka.speed`` document for the real sweep's points, with modelled times."""
    from flurka.attention import flops as flop_model
    from flurka.speed.configs import points
    from flurka.speed.timing import calls_for

    results = []
    pts = points(sweep, scopes=scopes)
    if sweep == "n-sweep":  # every third length (7050 ... 55050 in steps of 9000) keeps ingestion quick
        pts = [p for p in pts if (p.seq_len - 7050) % 9000 == 0]
    for i, p in enumerate(pts):
        shape = flop_model.AttentionShape(batch=p.batch, seq_len=p.seq_len, d_model=p.d_model, num_heads=p.num_heads,
                                          d_k=p.d_k, num_features=p.num_features)
        fwd = flop_model.forward_flops(p.mechanism, shape)
        if p.scope == "model":
            fwd = p.layers * (fwd + 4 * p.batch * p.seq_len * p.d_model * p.ffn)
        flops = 3 * fwd if p.mode == "train" else fwd
        rate = {"full": 3e14, "flash": 6e14}.get(p.mechanism, 1.5e14)
        scores_bytes = 4 * p.batch * p.num_heads * p.seq_len ** 2 * (3 if p.mode == "train" else 1)
        row = {**p.as_dict(), "index": i, "sweep": sweep, "device_name": DEVICE, "flops": flops}
        if p.mechanism == "full" and scores_bytes > 60e9:
            row.update(status="oom", oom_source="xla", median_s=None)
        else:
            t = (flops / rate + 2e-4) * float(np.exp(rng.normal(0, 0.03)))
            row.update(status="ok", median_s=t, p10_s=t * 0.98, p90_s=t * 1.03, repeats=10,
                       calls_per_sample=calls_for(t))
            floor = flops / 6.6e14                                  # the card's measured matrix rate
            row.update(floor_s=floor, compute_floor_s=floor, bound="compute", ratio_to_floor=t / floor)
            if sweep == "n-sweep" and p.scope == "layer" and p.mode == "forward" and p.seq_len == 52050:
                gemm = float(rng.uniform(0.5, 0.9))   # --profile-steps: where the time went
                row["profile"] = {"steps": 3, "traced_s_per_step": 0.97 * t, "ops": 40, "by_kind": {
                    "gemm": {"s_per_step": 0.97 * t * gemm, "share": gemm},
                    "elementwise": {"s_per_step": 0.97 * t * (1 - gemm), "share": 1 - gemm}},
                    "top_ops": [{"op": "cublas-gemm.1", "kind": "gemm", "share": gemm}]}
        results.append(row)
    return {"schema": "flurka.speed/1", "sweep": sweep, "created": "2025-01-02T03:04:05+00:00",
            "device": {"name": DEVICE, "platform": "gpu", "count": 1, "host": "gpu-7"},
            "versions": {"python": "3.12.3", "jax": "0.11.0"}, "settings": {"repeats": 10}, "ceilings": None,
            "results": results}


def theory_document(rng: np.random.Generator) -> dict:
    """Rows shaped like ``flurka.theory``'s: error falls with d_k and m; ranks below full."""
    errors = []
    for seed in (0, 1, 2):
        for mech in MECHS:
            dks = (16, 32, 64, 128) if mech == "linformer" or mech.startswith("flurka") else (None,)
            ms = (8, 16, 32, 64) if mech.endswith("performer") else (None,)
            for d_k in dks:
                for m in ms:
                    low = 0.0 if d_k is None else 2.0 / np.sqrt(d_k)
                    ker = 0.0 if mech in ("full", "flash", "linformer") else (1.5 / np.sqrt(m) if m else 0.3)
                    row = {"mechanism": mech, "d_k": d_k, "m": m, "seed": seed,
                           "rel_error": (low + ker) * (0.8 + 0.05 * rng.random()), "inf_error": 10 * (low + ker)}
                    if mech.startswith("flurka"):
                        row.update(kernel_term=ker * 1.1, lowrank_term=low * 1.05)
                    errors.append(row)
    ranks = [{"mechanism": mech, "layer": layer, "head": head, "rank": int(rng.integers(20, 60)), "max_rank": 128}
             for mech in ("performer", "rnn", "flurka-performer") for layer in range(3) for head in range(0, 4, 2)]
    return {"device": {"name": "cpu"}, "config": {"d_model": 256, "num_heads": 4, "seq_len": 128},
            "approximation_errors": errors, "ranks": ranks}


MAIN_STEPS, MAIN_LOG = 600, 25
MAIN_ALPHAS = (0.25, 0.375, 0.5, 0.75)
MAIN_DK = (16, 32)
MAIN_SEEDS = (0, 1, 2)
# BLEU from scratch and FLOPs per training step (nmt-small at batch 64: ~1e11)
MAIN_BLEU = {"full": 98.0, ("linformer", 16): 96.8, ("linformer", 32): 97.6, "performer": 88.5, "rnn": 72.0,
             "eva": 90.0}
MAIN_FLOPS = {"full": 2.4e11, "linformer": 1.6e11, "performer": 1.8e11, "rnn": 1.7e11, "eva": 2.0e11,
              "flurka-performer": 1.5e11, "flurka-rnn": 1.45e11}
MAIN_FLOOR = {"full": 0.30, "linformer": 0.34, "performer": 0.45, "rnn": 0.62, "eva": 0.42,
              "flurka-performer": 0.40, "flurka-rnn": 0.55}


def _main_curve(mech, d_k, seed, *, start=None):
    """Loss / cumulative train_flops every 25 steps; ``start`` = (fork step, the base's curve)."""
    points, flops = [], 0.0
    base = {p["step"]: p for p in start[1]} if start else {}
    for step in range(MAIN_LOG, MAIN_STEPS + 1, MAIN_LOG):
        if start and step <= start[0]:
            points.append(dict(base[step]))
            continue
        rate = MAIN_FLOPS[mech] * (1 + (d_k or 0) / 400)
        if start:
            fork, at = start[0], base[start[0]]
            flops = at["train_flops"] + rate * (step - fork)
            loss = MAIN_FLOOR[mech] + (at["loss"] - MAIN_FLOOR[mech]) * np.exp(-(step - fork) / 90)
        else:
            flops = rate * step
            loss = MAIN_FLOOR[mech] + 3.4 * np.exp(-step / 110)
        points.append({"step": step, "loss": float(loss * (1 + 0.01 * seed)), "train_flops": float(flops)})
    return points


def main_job_record(rng: np.random.Generator) -> dict:
    """The main job's sweep: nmt-small, mechanisms from scratch, FLuRKA α branches per (d_k, seed)."""
    trials = []

    def add(key, mech, bleu, seed, curve, d_k=None, alpha=None, num_features=None):
        trials.append({"trial_key": key, "attention": mech, "benchmark": "nmt-small", "seed": seed, "status": "ok",
                       "steps": MAIN_STEPS, "alpha": alpha, "base": "linformer" if alpha is not None else None,
                       "d_k": d_k, "num_features": num_features, "train_flops": curve[-1]["train_flops"],
                       "wall_time_s": 76.0, "metrics": {"bleu": float(bleu), "loss": curve[-1]["loss"]},
                       "curve": curve})

    for seed in MAIN_SEEDS:
        shift = rng.normal(0, 0.5)
        for mech in ("full", "performer", "rnn", "eva"):
            add(f"baseline/{mech}/s{seed}", mech, MAIN_BLEU[mech] + shift + rng.normal(0, 0.6), seed,
                _main_curve(mech, None, seed), num_features=16 if mech == "performer" else None)
        for d_k in MAIN_DK:
            base = _main_curve("linformer", d_k, seed)
            add(f"baseline/linformer/s{seed}/dk{d_k}", "linformer",
                MAIN_BLEU[("linformer", d_k)] + shift + rng.normal(0, 0.4), seed, base, d_k=d_k)
            for mech, kernel, low in (("flurka-performer", 88.5, 96.8), ("flurka-rnn", 72.0, 96.8)):
                for alpha in MAIN_ALPHAS:
                    # between the constituents, best near 37.5 %
                    bleu = kernel + (low - kernel) * (0.55 - 1.2 * (alpha - 0.375) ** 2) + shift + rng.normal(0, 0.6)
                    fork = int(round(alpha * MAIN_STEPS))
                    add(f"branch/{mech}/s{seed}/dk{d_k}/a{alpha}", mech, bleu, seed,
                        _main_curve(mech, d_k, seed, start=(fork, base)), d_k=d_k, alpha=alpha,
                        num_features=16 if mech == "flurka-performer" else None)
    return {"sweep_id": "uptrain-small-test", "name": "uptrain-small", "created_at": "2026-12-01T10:00:00+00:00",
            "git_commit": "def5678", "environment": {"device": "cpu", "host": "laptop", "versions": {"jax": "0.11.0"}},
            "trials": trials}


def _main_job_db(tmp_path_factory, name: str, keep=lambda trial: True) -> str:
    """URL of a new database holding the main job's sweep, the trials ``keep`` keeps."""
    record = main_job_record(np.random.default_rng(1))
    record["trials"] = [t for t in record["trials"] if keep(t)]
    url = f"sqlite:///{tmp_path_factory.mktemp(name) / 'results.db'}"
    engine = open_results(url)
    ingest_sweep(engine, record)
    engine.dispose()
    return url


@pytest.fixture(scope="session")
def main_job(tmp_path_factory) -> str:
    """URL of a database holding only the main job's sweep (nmt-small, 3 seeds, 2 d_k, 2 variants × 4 α)."""
    return _main_job_db(tmp_path_factory, "main-job")


@pytest.fixture(scope="session")
def one_alpha_job(tmp_path_factory) -> str:
    """URL of the main job's database with one α per row (α = 37.5 % alone): no best α to star."""
    return _main_job_db(tmp_path_factory, "one-alpha", lambda t: t["alpha"] in (None, 0.375))


@pytest.fixture(scope="session")
def no_full_job(tmp_path_factory) -> str:
    """URL of the main job's database as `make sweep` trains it: no full attention (no target loss)."""
    return _main_job_db(tmp_path_factory, "no-full", lambda t: t["attention"] != "full")


@pytest.fixture(scope="session")
def populated(tmp_path_factory):
    """(database URL, theory file) of the full synthetic data set, ingested once per session."""
    root = tmp_path_factory.mktemp("report-data")
    rng = np.random.default_rng(0)
    url = f"sqlite:///{root / 'results.db'}"
    engine = open_results(url)
    ingest_sweep(engine, sweep_record(rng))
    for sweep, scopes in (("n-sweep", ["layer"]), ("dk-sweep", ["layer"]), ("dmodel-sweep", ["layer"]),
                          ("flash-compare", None)):
        path = root / f"{sweep}.json"
        path.write_text(json.dumps(speed_document(sweep, rng, scopes=scopes)))
        ingest_file(engine, path)
    engine.dispose()
    theory = root / "theory.json"
    theory.write_text(json.dumps(theory_document(rng)))
    return url, theory


@pytest.fixture
def synthetic_theory() -> dict:
    """The synthetic theory file's content (rank rows per layer), fresh per test."""
    return theory_document(np.random.default_rng(0))


@pytest.fixture(scope="session")
def device_name() -> str:
    return DEVICE



