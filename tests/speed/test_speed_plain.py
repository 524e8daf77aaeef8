"""The plain forms the layers are timed against (``flurka.speed.plain``) compute the layers'
function: same outputs on the real rows, same input gradients, padding junk ignored by both —
else the benchmark's ratio would compare two different computations."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flurka.speed import plain

SMALL = dataclasses.replace(plain.SIZES["small"], batch=3, seq_len=24, padded=7, d_k=8)


@pytest.mark.parametrize("mechanism", plain.PLAIN)
def test_the_plain_form_is_the_layer(mechanism):
    layer, x, mask = plain.build(mechanism, SMALL)
    p = plain.layer_params(layer)
    real = np.asarray(mask)
    junk = jnp.where(mask[..., None], x, 1e3 * jax.random.normal(jax.random.key(9), x.shape))

    def both(x):
        return layer(x, mask), plain.plain_forward(mechanism, p, x, mask,
                                                   num_heads=SMALL.num_heads)

    y, z = both(junk)
    np.testing.assert_allclose(np.asarray(z)[real], np.asarray(y)[real], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(both(x)[1])[real], np.asarray(z)[real],
                               rtol=2e-5, atol=2e-5)   # the padding's content changes nothing
    w = jax.random.normal(jax.random.key(3), y.shape) * mask[..., None]
    gy, gz = (jax.grad(lambda x, i=i: jnp.sum(both(x)[i] * w))(x) for i in (0, 1))
    np.testing.assert_allclose(np.asarray(gz), np.asarray(gy), rtol=1e-4, atol=1e-5)
    assert float(jnp.abs(gy).max()) > 0


def test_the_benchmark_writes_a_ratio_per_mechanism_and_mode(tmp_path, capsys):
    out = tmp_path / "plain.json"
    assert plain.main(["--sizes", "small", "--mechanisms", "full,flurka-rnn", "--warmup", "0",
                       "--repeats", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == plain.SCHEMA and doc["device"]["platform"] == "cpu"
    assert {(r["mechanism"], r["mode"]) for r in doc["results"]} == {
        (m, mode) for m in ("full", "flurka-rnn") for mode in plain.MODES}
    for row in doc["results"]:
        r = row["ratio"]
        assert r["n"] == 3 and r["low"] <= r["mean"] <= r["high"] and r["median"] > 0
        assert row["layer"]["repeats"] == row["plain"]["repeats"] == 3
    assert "flurka-rnn" in capsys.readouterr().out


def test_an_unknown_mechanism_is_one_line_before_any_compute(capsys):
    with pytest.raises(SystemExit) as err:
        plain.main(["--mechanisms", "full,eva"])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "unknown mechanism(s) ['eva']" in lines[-1]
