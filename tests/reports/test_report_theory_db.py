"""The theory sections drawn from theory runs ingested into the results database (``flurka ingest
theory.json``), alone or with ``--theory`` files: the same figures and tables either way, captured
inputs apart from random ones, and per-layer results where the rows carry a layer."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pandas as pd
import pytest

from flurka.reports import build_report, sections, sources
from flurka.results import ingest_file, ingest_theory, open_results

CONFIG = {"seq_len": 16, "d_model": 16, "num_heads": 2, "batch": 1, "seeds": [0, 1], "d_k": [8], "m": [4],
          "inputs": "standard normal", "matmul_precision": "highest", "rank_d_k": 8, "rank_m": 4}
CAPTURED = "captured: listops-rnn (lra-listops-small, flurka-rnn, step 40)"


@pytest.fixture(scope="module")
def real_rows():
    """flurka.theory's own rows at tiny sizes: errors (2 seeds) and ranks of one layer."""
    import jax
    from flax import nnx

    from flurka.attention import make_attention
    from flurka import theory

    errors = theory.approximation_errors(d_model=16, num_heads=2, seq_len=16, d_k_values=(8,), m_values=(4,),
                                         mechanisms=("full", "linformer", "performer", "flurka-performer"),
                                         seeds=(0, 1), batch=1)
    layer = make_attention("flurka-performer", d_model=16, num_heads=2, max_len=16, d_k=8, num_features=4,
                           rngs=nnx.Rngs(0))
    got = theory.kernel_attention_ranks(layer, jax.random.normal(jax.random.key(0), (1, 16, 16)))
    ranks = [{"mechanism": "flurka-performer", "seed": 0, "example": 0, "head": h, "rank": int(got[0, h]),
              "max_rank": 8, "d_k": 8, "m": 4} for h in range(got.shape[1])]
    return errors, ranks


def document(rows, *, captured=False, created="2026-11-26T09:00:00+00:00") -> dict:
    """A ``flurka.theory/1`` document; ``captured``: rows for the inputs captured at layers 0 and 1."""
    errors, ranks = copy.deepcopy(rows)
    config = dict(CONFIG)
    if captured:
        config.update(inputs=CAPTURED, source={"run_dir": "/runs/listops-rnn", "step": 40})
        errors = [{**r, "layer": k, "rel_error": r["rel_error"] * (1 + k)} for k in (0, 1) for r in errors]
        ranks = [{**r, "layer": k} for k in (0, 1) for r in ranks]
    return {"schema": "flurka.theory/1", "created": created,
            "device": {"name": "cpu", "platform": "cpu", "count": 1, "host": "laptop", "visible_devices": None},
            "versions": {"jax": "0.10.0"}, "config": config, "approximation_errors": errors, "ranks": ranks}


def database(tmp_path, *docs) -> str:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = open_results(url)
    for doc in docs:
        ingest_theory(engine, doc)
    engine.dispose()
    return url


def captions(out) -> dict[str, str]:
    html = (out / "index.html").read_text()
    return dict(re.findall(r'<figure class="(?:plot|table)" id="([^"]+)">.*?<figcaption>(.*?)</figcaption>', html, re.S))


def test_report_from_theory_rows_in_the_database_alone(synthetic_theory, tmp_path):
    """Only ingested theory runs (the synthetic paper-shaped file, its rank rows per layer): both
    theory sections draw, every other section says what to run."""
    rows = synthetic_theory
    doc = {"schema": "flurka.theory/1", "created": "2026-11-26T09:00:00+00:00", **rows}
    path = tmp_path / "theory.json"
    path.write_text(json.dumps(doc))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = open_results(url)
    assert ingest_file(engine, path).added == len(rows["approximation_errors"]) + len(rows["ranks"])
    engine.dispose()
    out = tmp_path / "report"
    build_report(url, out)
    md = (out / "report.md").read_text()
    assert md.count("\n- **") == 13 and md.count("**: run `") == 13   # one line each, under "Not in this database"
    assert md.index("## Approximation error") < md.index("## Rank of") < md.index("## Not in this database")
    assert {p.stem for p in (out / "figures").glob("*.png")} == {"error-0", "rank-0"}
    assert {p.stem for p in (out / "tables").glob("*.csv")} == {"error-0-table", "rank-0-table"}
    ranks = pd.read_csv(out / "tables" / "rank-0-table.csv")
    assert list(ranks.columns[:2]) == ["mechanism", "layer"]  # per layer
    assert len(ranks) == 3 * 3 and set(ranks["layer"]) == {0, 1, 2}
    want = pd.DataFrame(rows["ranks"]).groupby(["mechanism", "layer"])["rank"].mean()
    for _, r in ranks.iterrows():
        assert r["mean_rank"] == pytest.approx(want[(r["mechanism"], r["layer"])])
        assert r["heads"] == 2 and r["full_rank"] == 128
    errors = pd.read_csv(out / "tables" / "error-0-table.csv")
    fp = errors[(errors["mechanism"] == "flurka-performer") & (errors["d_k"] == 32) & (errors["m"] == 16)]
    raw = [r["rel_error"] for r in rows["approximation_errors"]
           if (r["mechanism"], r["d_k"], r["m"]) == ("flurka-performer", 32, 16)]
    assert len(fp) == 1 and fp["rel_error"].iloc[0] == pytest.approx(np.mean(raw)) and fp["seeds"].iloc[0] == 3
    caption = captions(out)["rank-0"]
    assert caption.startswith("Device: cpu. Config: d_model=256, num_heads=4, seq_len=128.")
    assert "results DB (theory run of 2026-11-26 09:00 UTC)" in caption and "layer(s) 0, 1, 2" in caption


def test_captured_inputs_apart_from_random_inputs_and_per_layer(real_rows, tmp_path):
    url = database(tmp_path, document(real_rows), document(real_rows, captured=True))
    engine = open_results(url)
    theory = sources.with_stored(engine, sources.load_theory())
    engine.dispose()
    err, rank = sections.error_section(theory), sections.rank_section(theory)
    plots = [i for i in err.items if isinstance(i, sections.Plot)]
    from_run = "inputs captured from listops-rnn (lra-listops-small, flurka-rnn, step 40)"
    assert sorted(p.title for p in plots) == [f"Approximation error (cpu; {from_run}, layer 0)",
                                              f"Approximation error (cpu; {from_run}, layer 1)",
                                              "Approximation error (cpu; standard normal inputs, N 16)"]
    for p in plots:
        random = "layer" not in p.title
        assert ("inputs=standard normal" in p.caption) == random and (CAPTURED in p.caption) == (not random)
    tables = {i.title: i.df.reset_index() for i in err.items if isinstance(i, sections.Table)}
    for title, factor in (("Approximation error (cpu; standard normal inputs, N 16)", 1),
                          (f"Approximation error (cpu; {from_run}, layer 1)", 2)):
        got = tables[title].set_index("mechanism").loc["linformer"]
        want = np.mean([r["rel_error"] for r in real_rows[0] if r["mechanism"] == "linformer"]) * factor
        assert got["rel_error"] == pytest.approx(want) and got["seeds"] == 2  # layers never pooled
    rank_tables = [i.df for i in rank.items if isinstance(i, sections.Table)]
    assert len(rank_tables) == 2  # random and captured inputs: separate figures and tables
    by_layer = next(t for t in rank_tables if "layer" in t.index.names)
    assert list(by_layer.index) == [("flurka-performer", 0.0), ("flurka-performer", 1.0)]
    plain = next(t for t in rank_tables if "layer" not in t.index.names)
    assert list(plain.index) == ["flurka-performer"] and plain.loc["flurka-performer", "heads"] == 2
    captured = next(i for i in rank.items if isinstance(i, sections.Plot) and CAPTURED in i.caption)
    assert captured.title == f"Rank per layer and head (cpu; {from_run})" and "layer(s) 0, 1" in captured.caption
    labels = [t.get_text() for t in captured.fig.axes[0].get_xticklabels()]
    assert labels == ["L0H0", "L0H1", "L1H0", "L1H1"]


def test_database_and_file_draw_the_same_report(real_rows, tmp_path):
    """A DB-only report and a file-only report of the same documents: the same figures (PNG bytes)
    and tables; captions differ only in the source. DB and the same file together count once."""
    docs = [document(real_rows), document(real_rows, captured=True)]
    files = []
    for i, doc in enumerate(docs):
        files.append(tmp_path / f"theory-{i}.json")
        files[-1].write_text(json.dumps(doc))
    (tmp_path / "db").mkdir()
    (tmp_path / "empty").mkdir()
    with_rows, empty = database(tmp_path / "db", *docs), database(tmp_path / "empty")
    reports = {"db": (with_rows, []), "files": (empty, files), "both": (with_rows, files)}
    for name, (url, theory) in reports.items():
        build_report(url, tmp_path / name, theory=theory)
    figures = sorted(p.name for p in (tmp_path / "db" / "figures").glob("*.png"))
    assert figures == ["error-0.png", "error-1.png", "error-2.png", "rank-0.png", "rank-1.png"]
    tables = sorted(p.name for p in (tmp_path / "db" / "tables").glob("*.csv"))
    for other in ("files", "both"):
        assert sorted(p.name for p in (tmp_path / other / "figures").glob("*.png")) == figures
        for f in figures:
            assert (tmp_path / other / "figures" / f).read_bytes() == (tmp_path / "db" / "figures" / f).read_bytes()
        assert sorted(p.name for p in (tmp_path / other / "tables").glob("*.csv")) == tables
        for t in tables:
            assert (tmp_path / other / "tables" / t).read_text() == (tmp_path / "db" / "tables" / t).read_text()
    db_caps, file_caps = captions(tmp_path / "db"), captions(tmp_path / "files")
    for key, caption in db_caps.items():
        if key.startswith(("error-", "rank-")):
            stem = caption.split(" Source: ")[0]
            assert file_caps[key].split(" Source: ")[0] == stem
            assert "results DB (theory run of 2026-11-26 09:00 UTC)" in caption and "theory-" in file_caps[key]


def test_report_command_draws_every_theory_file_it_is_given(real_rows, tmp_path):
    """``--theory A --theory B`` and ``--theory A B`` both draw A and B (the flag repeated once
    kept only the last file: random inputs and a trained model's, one silently dropped)."""
    from flurka.cli import main

    files = [tmp_path / "random.json", tmp_path / "captured.json"]
    for f, doc in zip(files, (document(real_rows), document(real_rows, captured=True))):
        f.write_text(json.dumps(doc))
    url = database(tmp_path)
    for name, flags in (("repeated", ["--theory", str(files[0]), "--theory", str(files[1])]),
                        ("listed", ["--theory", *map(str, files)])):
        assert main(["report", "--db", url, "--out", str(tmp_path / name), *flags]) == 0
        figures = sorted(p.name for p in (tmp_path / name / "figures").glob("*.png"))
        assert figures == ["error-0.png", "error-1.png", "error-2.png", "rank-0.png", "rank-1.png"], name
        html = (tmp_path / name / "index.html").read_text()
        assert "standard normal inputs" in html and "inputs captured from listops-rnn" in html
