"""The theory on a trained model (flurka.theory.trained, ``--from-run``): restoring a run, capturing
what each attention layer receives, errors and ranks on those inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from training_helpers import tiny

from flurka.theory import cli as theory_cli
from flurka.theory import trained as T
from flurka.training import load_run
from flurka.training import run as train_run

STEPS = 6


@pytest.fixture(scope="module")
def rnn_run(tmp_path_factory):
    """A 2-layer rnn model trained for a few steps on ListOps (variable lengths, so padded rows)."""
    workdir = tmp_path_factory.mktemp("trained") / "listops-rnn"
    result = train_run(tiny("lra-listops-small", steps=STEPS, checkpoint_every=STEPS, workdir=str(workdir),
                              model=dict(attention="rnn", num_layers=2)))
    assert result["status"] == "ok"
    return workdir, result


@pytest.fixture(scope="module")
def loaded(rnn_run):
    return load_run(str(rnn_run[0]))


@pytest.fixture(scope="module")
def captured(loaded):
    return T.capture(loaded, 3)


def test_load_run_restores_the_trained_model(rnn_run, loaded):
    """The restored model scores on the eval split exactly what the run reported at its end."""
    _, result = rnn_run
    assert (loaded.step, loaded.attention, loaded.config.model.num_layers) == (STEPS, "rnn", 2)
    stats: dict[str, list] = {}
    for i, batch in enumerate(loaded.dataset.eval_batches(loaded.config.batch_size)):
        if i >= loaded.config.eval_batches:
            break
        batch = {k: jnp.asarray(v) for k, v in batch.items() if isinstance(v, np.ndarray)}
        for k, v in loaded.task.eval_stats(loaded.model, batch).items():
            stats.setdefault(k, []).append(np.asarray(v))
    metrics = loaded.task.summarize({k: np.concatenate(v) for k, v in stats.items()})
    assert metrics["accuracy"] == pytest.approx(result["final_metrics"]["accuracy"], abs=1e-6)
    assert metrics["loss"] == pytest.approx(result["final_metrics"]["loss"], rel=1e-5)


def test_capture_records_each_blocks_attention_input(loaded, captured):
    """Layer 0 receives LN(embedding), layer 1 LN(block 0's output) — recomputed here from the
    model's modules — and the model is left as it was."""
    model = loaded.model
    batch = next(loaded.dataset.eval_batches(3))
    inputs, mask = jnp.asarray(batch["inputs"]), jnp.asarray(batch["mask"])
    blocks = model.encoder.layers
    h0 = model.embedding(inputs, None)
    h1 = blocks[0](h0, mask, deterministic=True)
    assert [c.layer for c in captured] == [0, 1]
    for c, h, block in zip(captured, (h0, h1), blocks):
        np.testing.assert_allclose(c.x, block.attention_norm(h), rtol=1e-6, atol=1e-6)
        assert c.attention is block.attention and bool(jnp.all(c.mask == mask))
    assert not mask.all()  # ListOps pads: the masked paths are exercised
    assert all(b.attention.mechanism == "rnn" for b in blocks)  # the recorders are gone


def test_trained_ranks_are_those_of_the_layers_own_features(captured):
    """``trained: true`` rows: rank of elu(Q)+1 · (elu(K)+1)ᵀ over each example's real tokens,
    recomputed in float64 NumPy from the layer's weights and the captured inputs."""
    rows = T.rank_rows(captured, ["rnn", "performer"], d_k=8, m=8)
    own = [r for r in rows if r["trained"]]
    assert {r["mechanism"] for r in own} == {"rnn"} and {r["layer"] for r in own} == {0, 1}
    assert all(not r["trained"] for r in rows if r["mechanism"] == "performer")
    for c in captured:
        layer = c.attention
        x = np.asarray(c.x, np.float64)

        def proj(p):
            return x @ np.asarray(p.kernel.value, np.float64) + np.asarray(p.bias.value, np.float64)

        b, n, _ = x.shape
        h, d = layer.num_heads, layer.head_dim
        q, k = proj(layer.query).reshape(b, n, h, d), proj(layer.key).reshape(b, n, h, d)
        real = np.asarray(c.mask)
        for r in (r for r in own if r["layer"] == c.layer):
            i, j = r["example"], r["head"]
            qf, kf = (np.where(a > 0, a + 1, np.exp(a))[i, real[i], j] for a in (q, k))
            assert r["rank"] == np.linalg.matrix_rank(qf @ kf.T)
            assert r["max_rank"] == real[i].sum() and r["rank"] <= d


def test_trained_errors_count_real_rows_only(captured):
    """Errors against full attention with the trained projections: exact for full; FLuRKA within
    its kernel + low-rank terms (Theorem 1's triangle inequality, per example); padded rows'
    contents change nothing."""
    grid = dict(d_k_values=[8], m_values=[8], seeds=[0],
                mechanisms=["full", "linformer", "performer", "flurka-performer"])
    rows = T.error_rows(captured, **grid)
    assert {r["layer"] for r in rows} == {0, 1} and len(rows) == 2 * 4
    for r in rows:
        if r["mechanism"] == "full":
            assert r["rel_error"] < 1e-6
        else:
            assert r["rel_error"] > 1e-3
        if r["mechanism"] == "flurka-performer":
            assert r["rel_error"] <= r["kernel_term"] + r["lowrank_term"] + 1e-9
    junk = [T.Captured(c.layer, c.attention,
                       jnp.where(c.mask[..., None], c.x, 7.0 + c.x), c.mask) for c in captured]
    again = T.error_rows(junk, **grid)
    for a, b in zip(rows, again):
        assert a["rel_error"] == pytest.approx(b["rel_error"], rel=1e-5, abs=1e-7)


def test_cli_from_run_writes_per_layer_rows(rnn_run, tmp_path):
    workdir, _ = rnn_run
    out = tmp_path / "theory.json"
    code = theory_cli.main(["--from-run", str(workdir), "--d-k", "8", "--features", "4,8",
                            "--seeds", "0", "--batch", "2", "--mechanisms", "full,rnn,flurka-rnn",
                            "--rank-mechanisms", "rnn,flurka-rnn", "--out", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    config = doc["config"]
    assert config["inputs"] == f"captured: listops-rnn (lra-listops-small, rnn, step {STEPS})"
    assert config["source"]["step"] == STEPS and config["source"]["layers"] == 2
    assert (config["d_model"], config["num_heads"]) == (16, 2) and config["seq_len"] > 8
    assert {(r["mechanism"], r["layer"]) for r in doc["approximation_errors"]} == {
        (m, layer) for m in ("full", "rnn", "flurka-rnn") for layer in (0, 1)}
    assert {(r["mechanism"], r["trained"]) for r in doc["ranks"]} == {("rnn", True), ("flurka-rnn", False)}

    # ... and lands in the results DB as it is (layer and trained kept), read back by the report
    import sqlalchemy as sa

    from flurka.reports import sources
    from flurka.results import ingest_file, models, open_results

    engine = open_results(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        assert ingest_file(engine, out).added == len(doc["approximation_errors"]) + len(doc["ranks"])
        with engine.connect() as conn:
            stored = set(conn.execute(sa.select(models.KernelRank.mechanism, models.KernelRank.layer,
                                                models.KernelRank.trained)).all())
        assert stored == {("rnn", 0, True), ("rnn", 1, True), ("flurka-rnn", 0, False), ("flurka-rnn", 1, False)}
        theory = sources.stored_theory(engine)
        assert set(theory.errors["layer"]) == {0, 1} and theory.ranks["trained"].any()
    finally:
        engine.dispose()


@pytest.mark.parametrize("argv,message", [
    (["--from-run", "/nonexistent/run"], "is not a training work dir with checkpoints"),
    (["--step", "3"], "--step needs --from-run"),
])
def test_cli_bad_run_is_one_line(argv, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "flurka.theory", *argv, "--out", str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "t.json").exists()


def test_cli_checks_the_runs_sizes_before_compute(rnn_run, tmp_path, capsys):
    """d_k longer than the run's sequences and a missing step: exit 2 from the metadata alone."""
    workdir, _ = rnn_run
    out = tmp_path / "t.json"
    assert theory_cli.main(["--from-run", str(workdir), "--d-k", "4096", "--out", str(out)]) == 2
    assert "must not exceed seq_len" in capsys.readouterr().err
    assert theory_cli.main(["--from-run", str(workdir), "--step", "2", "--out", str(out)]) == 2
    assert "no checkpoint for step 2" in capsys.readouterr().err
    assert not out.exists()
