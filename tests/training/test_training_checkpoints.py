"""Orbax round trip of params + optax state + metadata, exact to the bit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flurka.training.checkpoints import Checkpointer


def _state(seed):
    k = jax.random.split(jax.random.key(seed), 3)
    params = {"layers/0/attention/query/kernel": jax.random.normal(k[0], (8, 8)),
              "layers/0/attention/query/bias": jax.random.normal(k[1], (8,)),
              "head/kernel": jax.random.normal(k[2], (8, 3), jnp.float32).astype(jnp.bfloat16)}
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)))
    opt = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    for _ in range(3):
        upd, opt = tx.update(grads, opt, params)
        params = optax.apply_updates(params, upd)
    return {"params": params, "other": {"features": jnp.arange(6.0).reshape(2, 3)}, "opt_state": opt}


def test_round_trip_is_exact(tmp_path):
    state = _state(0)
    meta = {"step": 3, "attention": "flurka-rnn", "history": [{"step": 1, "loss": 2.5}]}
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(3, state, meta)
        ck.save(5, _state(1), {**meta, "step": 5})
        assert ck.steps() == [3, 5] and ck.latest_step() == 5
        assert ck.meta(3) == meta
        restored, got_meta = ck.restore(3, _state(7))        # target only gives the structure
    assert got_meta == meta
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_missing_step_and_directory(tmp_path):
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(2, _state(0), {"step": 2})
        with pytest.raises(ValueError, match=r"no checkpoint for step 4 .* available: \[2\]"):
            ck.meta(4)
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        Checkpointer(tmp_path / "nope", read_only=True)


def test_max_to_keep(tmp_path):
    with Checkpointer(tmp_path / "ck", max_to_keep=2) as ck:
        for s in (1, 2, 3):
            ck.save(s, _state(s), {"step": s})
        assert ck.steps() == [2, 3]


def test_reading_a_base_run_read_only_is_quiet(tmp_path, caplog):
    """Every up-training branch opens its base's checkpoints read-only; Orbax's notices about
    that (two warnings per open) filled the sweep's log once per trial."""
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(2, _state(0), {"step": 2})
    with caplog.at_level("INFO"):
        with Checkpointer(tmp_path / "ck", read_only=True) as ck:
            restored, meta = ck.restore(2, _state(1))
    assert meta == {"step": 2}
    assert not [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
