"""Fixtures for the results-database tests: a fresh database per test, on SQLite and PostgreSQL.

PostgreSQL comes from FLURKA_TEST_POSTGRES_URL (``.ci/run`` starts a server and sets it). Without
it the postgresql cases skip on a laptop but FAIL in CI (CI=true), so CI always covers both.
"""

from __future__ import annotations

import copy
import os

import pytest

from testsupport import scratch_postgres_database

from flurka.results import db

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path):
    """URL of an empty database of its own (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.db'}"
        return
    admin_url = os.environ.get("FLURKA_TEST_POSTGRES_URL")
    if not admin_url:
        if os.environ.get("CI"):
            pytest.fail("FLURKA_TEST_POSTGRES_URL is unset in CI: .ci/run must start PostgreSQL")
        pytest.skip("FLURKA_TEST_POSTGRES_URL unset (set by .ci/run)")
    with scratch_postgres_database(admin_url, "flurka_test") as url:
        yield url


@pytest.fixture
def engine(db_url):
    """A migrated, empty results database."""
    eng = db.upgrade(db_url)
    yield eng
    eng.dispose()


ENV = {"device": "NVIDIA H100 80GB HBM3", "host": "node-3", "versions": {"jax": "0.11.0", "flax": "0.12.8"}}


def trial(key, attention, benchmark, metrics, *, seed=0, status="ok", alpha=None, base=None, d_k=None,
          num_features=None, curve=None):
    return {"trial_key": key, "attention": attention, "benchmark": benchmark, "seed": seed, "status": status,
            "steps": 100, "alpha": alpha, "base": base, "d_k": d_k, "num_features": num_features,
            "train_flops": 3.0e18, "wall_time_s": 60.0, "metrics": metrics, "curve": curve or []}


def curve(losses, eflops):
    return [{"step": i + 1, "loss": l, "train_flops": f * 1e18} for i, (l, f) in enumerate(zip(losses, eflops))]


ENDE = "nmt-wmt14-ende"
# The paper's Table 2 full-attention row, as fractions: its Average is 81.5 (mean of all 12 columns).
FULL_GLUE = {"glue-cola": {"matthews": 0.489}, "glue-sst2": {"accuracy": 0.907},
             "glue-mrpc": {"f1": 0.891, "accuracy": 0.848}, "glue-stsb": {"pearson": 0.855, "spearman": 0.856},
             "glue-qqp": {"f1": 0.864, "accuracy": 0.900}, "glue-mnli": {"accuracy": 0.813, "accuracy_mismatched": 0.818},
             "glue-qnli": {"accuracy": 0.882}, "glue-rte": {"accuracy": 0.657}}
# The paper's Table 3 full-attention and EVA rows (averages 57.232 and 59.128).
FULL_LRA = {"listops": 0.3795, "text": 0.6018, "retrieval": 0.8045, "image": 0.3739, "pathfinder": 0.7019}
EVA_LRA = {"listops": 0.3861, "text": 0.6516, "retrieval": 0.8100, "image": 0.4160, "pathfinder": 0.6927}


def paper_sweep() -> dict:
    """A small but realistic sweep; the expected tables in test_results_tables.py are worked by hand."""
    t = [
        # Table 5 / Table 4 En-De (bleu). performer: configs nf=64 (27, 28 -> 27.5) and nf=128 (27.9).
        trial("p0", "performer", ENDE, {"bleu": 27.0}, seed=0, num_features=64),
        trial("p1", "performer", ENDE, {"bleu": 28.0}, seed=1, num_features=64),
        trial("p2", "performer", ENDE, {"bleu": 27.9}, seed=0, num_features=128),
        trial("l0", "linformer", ENDE, {"bleu": 28.0}, seed=0, d_k=64,
              curve=curve([0.9, 0.5], [1.0, 2.0])),
        trial("l1", "linformer", ENDE, {"bleu": 27.0}, seed=1, d_k=64),
        trial("r0", "rnn", ENDE, {"bleu": 23.41}),
        trial("fp-a1-s0", "flurka-performer", ENDE, {"bleu": 27.98}, seed=0, alpha=0.125, base="low-rank", d_k=64),
        trial("fp-a1-s1", "flurka-performer", ENDE, {"bleu": 27.0}, seed=1, alpha=0.125, base="low-rank", d_k=64),
        trial("fp-a3", "flurka-performer", ENDE, {"bleu": 28.0}, alpha=0.375, base="low-rank", d_k=64),
        trial("fp-div", "flurka-performer", ENDE, {"bleu": 99.0}, alpha=0.25, base="low-rank", d_k=64,
              status="diverged at step 40"),
        trial("fp-scratch", "flurka-performer", ENDE, {"bleu": 50.0}, d_k=64),
        trial("fr-a2", "flurka-rnn", ENDE, {"bleu": 24.57}, alpha=0.25, base="low-rank", d_k=64),
        trial("fe-a3", "flurka-eva", ENDE, {"bleu": 28.87}, alpha=0.375, base="low-rank", d_k=64,
              curve=curve([0.6, 0.24], [0.5, 1.0])),
        trial("f0", "full", ENDE, {"bleu": 24.65}, seed=0, curve=curve([1.0, 0.5, 0.2], [1.0, 2.0, 3.0])),
        trial("f1", "full", ENDE, {"bleu": 24.65}, seed=1, curve=curve([1.0, 0.25, 0.3], [1.0, 2.0, 3.0])),
        # Table 4, other columns (no En-Fr results at all: that column is left out).
        trial("f-img", "full", "imagenet", {"accuracy": 0.71662, "top5": 0.90982}),
        trial("f-mlm0", "full", "mlm-wikitext103", {"perplexity": 5.533}, seed=0),
        trial("f-mlm1", "full", "mlm-wikitext103", {"perplexity": 5.633}, seed=1),
        trial("l-mlm64", "linformer", "mlm-wikitext103", {"perplexity": 7.696}, d_k=64),
        trial("l-mlm128", "linformer", "mlm-wikitext103", {"perplexity": 7.5}, d_k=128),
        # Table 2: full attention everywhere, linformer only CoLA.
        *(trial(f"f-{b}", "full", b, m) for b, m in FULL_GLUE.items()),
        trial("l-cola", "linformer", "glue-cola", {"matthews": 0.292}),
        # Table 3.
        *(trial(f"f-lra-{k}", "full", f"lra-{k}", {"accuracy": v}) for k, v in FULL_LRA.items()),
        *(trial(f"e-lra-{k}", "eva", f"lra-{k}", {"accuracy": v}) for k, v in EVA_LRA.items()),
        trial("fe-small0", "flurka-eva", "lra-listops-small", {"accuracy": 0.5}, seed=0),
        trial("fe-small1", "flurka-eva", "lra-listops-small", {"accuracy": 0.6}, seed=1),
    ]
    return {"sweep_id": "paper-2024-05-01", "name": "paper tables", "created_at": "2024-05-01T12:00:00+00:00",
            "git_commit": "f5764a2", "environment": ENV, "trials": t}


def speed(mechanism, n, median, *, device="NVIDIA H100 80GB HBM3", status="ok"):
    return {"device": device, "host": "node-3", "versions": {"jax": "0.11.0"}, "mechanism": mechanism,
            "mode": "train", "N": n, "d_model": 512, "heads": 8, "d_k": 256, "m": 64, "batch": 1,
            "dtype": "bfloat16", "status": status, "median_s": median, "spread_s": None if median is None else 1e-4,
            "flops": 1e12}


def speed_records() -> list[dict]:
    return [
        speed("full", 1024, 0.010), speed("flash", 1024, 0.004), speed("linformer", 1024, 0.006),
        speed("performer", 1024, 0.005), speed("flurka-performer", 1024, 0.002),
        speed("full", 4096, None, status="oom"), speed("flash", 4096, 0.040), speed("linformer", 4096, 0.030),
        speed("performer", 4096, 0.020), speed("flurka-performer", 4096, 0.010),
        speed("full", 1024, 0.5, device="cpu"),
    ]


@pytest.fixture
def sweep_dict():
    """The paper-tables sweep record as JSON-like dicts (a fresh copy per test)."""
    return copy.deepcopy(paper_sweep())


@pytest.fixture
def speed_dicts():
    return speed_records()


@pytest.fixture
def make_trial():
    """trial(key, attention, benchmark, metrics, **fields) -> a trial dict."""
    return trial


@pytest.fixture
def seeded(engine, sweep_dict, speed_dicts):
    """A migrated database holding the paper-tables sweep and the speed records."""
    from flurka.results import ingest_speed, ingest_sweep

    ingest_sweep(engine, sweep_dict)
    ingest_speed(engine, speed_dicts)
    return engine


@pytest.fixture(scope="session")
def theory_rows():
    """Real rows of flurka.theory at tiny sizes (computed once): every mechanism's error at
    d_k=8, m=4, and the ranks of two feature-map layers (examples × heads)."""
    import jax
    from flax import nnx

    from flurka.attention import make_attention
    from flurka import theory

    errors = theory.approximation_errors(d_model=16, num_heads=2, seq_len=16, d_k_values=(8,), m_values=(4,),
                                         seeds=(0,))
    ranks = []
    for mech, opts in (("performer", {"num_features": 4}), ("flurka-rnn", {"d_k": 8})):
        layer = make_attention(mech, d_model=16, num_heads=2, max_len=16, rngs=nnx.Rngs(0), **opts)
        got = theory.kernel_attention_ranks(layer, jax.random.normal(jax.random.key(0), (2, 16, 16)))
        ranks += [{"mechanism": mech, "seed": 0, "example": b, "head": h, "rank": int(got[b, h]),
                   "max_rank": opts.get("d_k", 16), "d_k": opts.get("d_k"), "m": opts.get("num_features")}
                  for b in range(got.shape[0]) for h in range(got.shape[1])]
    return errors, ranks


def theory_document(rows, *, captured: bool = False, created: str = "2026-11-26T09:00:00+00:00") -> dict:
    """A ``flurka.theory/1`` document around ``rows``; ``captured``: as if measured on a trained
    model's captured inputs, each row repeated for layers 0 and 1 (``layer`` set)."""
    errors, ranks = copy.deepcopy(rows)
    config = {"seq_len": 16, "d_model": 16, "num_heads": 2, "batch": 2, "seeds": [0], "d_k": [8], "m": [4],
              "inputs": "standard normal", "matmul_precision": "highest", "rank_d_k": 8, "rank_m": 4}
    if captured:
        config["inputs"] = "captured: listops-rnn (lra-listops-small, flurka-rnn, step 40)"
        config["source"] = {"run_dir": "/runs/listops-rnn", "step": 40, "benchmark": "lra-listops-small",
                            "attention": "flurka-rnn"}
        errors = [{**r, "layer": layer, "rel_error": r["rel_error"] * (1 + layer)} for layer in (0, 1) for r in errors]
        ranks = [{**r, "layer": layer, "rank": max(r["rank"] - layer, 0), "trained": r["mechanism"] == "flurka-rnn",
                  "seed": None} for layer in (0, 1) for r in ranks]
    return {"schema": "flurka.theory/1", "created": created,
            "device": {"name": "cpu", "platform": "cpu", "count": 1, "host": "laptop", "visible_devices": None},
            "versions": {"python": "3.11.9", "jax": "0.10.0", "cudnn": None}, "config": config,
            "approximation_errors": errors, "ranks": ranks}


@pytest.fixture
def theory_doc(theory_rows):
    """A fresh random-input theory document (real rows); ``theory_doc_of(captured=...)`` for others."""
    return theory_document(theory_rows)


@pytest.fixture
def theory_doc_of(theory_rows):
    return lambda **kw: theory_document(theory_rows, **kw)
