"""The persistent compilation cache across processes, and the compile accounting that reports it.

Each run is a fresh interpreter: JAX opens its cache once per process, at the first compile. They
run without the suite's own cache (tests/conftest.py), so only the cache under test is in play."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from flurka.training import compilation

PROGRAM = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    from flurka.training import compilation

    if sys.argv[1] != "off":
        compilation.use_persistent_cache(sys.argv[1])
    with compilation.accounting() as stats:
        x = jnp.arange(12.0).reshape(3, 4)
        y = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(axis=0))(x)
    print(json.dumps({**stats, "y": y.tolist()}))
""")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    return {**env, "JAX_PLATFORMS": "cpu"}


def _run(cache: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROGRAM, cache], capture_output=True, text=True, check=True,
                         env=_env())
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    cache = tmp_path / "jax-cache"
    first = _run(str(cache))
    assert first["compiles"] >= 1 and first["cache_hits"] == 0 and first["compile_s"] > 0
    assert any(cache.iterdir())                                # every program is kept, however small
    second = _run(str(cache))
    assert second["compiles"] == first["compiles"]
    assert second["cache_hits"] == second["compiles"]          # nothing compiled again
    assert second["y"] == first["y"]


def test_without_the_cache_every_process_compiles(tmp_path):
    runs = [_run("off") for _ in range(2)]
    assert all(r["cache_hits"] == 0 and r["compiles"] >= 1 for r in runs)


def test_accounting_stops_counting_after_its_block():
    import jax
    import jax.numpy as jnp

    with compilation.accounting() as stats:
        jax.jit(lambda a: a * 3.0 + 1.0)(jnp.ones(5)).block_until_ready()
    seen = dict(stats)
    jax.jit(lambda a: a * 5.0 - 2.0)(jnp.ones(7)).block_until_ready()
    assert seen["compiles"] >= 1 and stats == seen


def test_a_process_that_compiled_before_takes_the_cache_it_is_pointed_at(tmp_path):
    """JAX opens its cache at the first compile and keeps it: pointing it elsewhere later (a
    reused worker, a second sweep in one process) still reaches the next compile."""
    import jax
    import jax.numpy as jnp

    jax.jit(lambda a: a - 4.0)(jnp.ones(3)).block_until_ready()     # the cache is opened here
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    try:
        for name in ("first", "second"):
            compilation.use_persistent_cache(tmp_path / name)
            jax.jit(lambda a: a * 7.0 + len(name))(jnp.ones(11)).block_until_ready()
            assert any((tmp_path / name).iterdir()), name
    finally:
        compilation.compilation_cache.set_cache_dir(before[0])
        compilation.compilation_cache.reset_cache()
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


def test_flurka_train_reruns_from_the_cache(tmp_path):
    """``flurka train --compilation-cache DIR``: the second run of a config loads every program
    the first compiled, and trains to the same loss."""
    def train():
        out = subprocess.run(
            [sys.executable, "-m", "flurka.cli", "train", "--benchmark", "lra-listops-small",
             "--attention", "flurka-rnn", "--steps", "2", "--json", "--no-progress",
             "--compilation-cache", str(tmp_path / "cache"), "--set", "model.d_model=16",
             "--set", "model.d_ff=32", "--set", "model.num_layers=1", "--set", "batch_size=4",
             "--set", "eval_every=0", "--set", "eval_batches=1", "--set", "warmup_steps=0"],
            capture_output=True, text=True, check=True, env=_env())
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = train(), train()
    assert first["compilation"]["compiles"] > 0 and first["compilation"]["cache_hits"] == 0
    assert second["compilation"]["cache_hits"] == second["compilation"]["compiles"] == first["compilation"]["compiles"]
    assert second["history"] == first["history"] and second["final_metrics"] == first["final_metrics"]


def test_a_single_run_caches_by_default(monkeypatch, tmp_path):
    """Issue 59: a researcher's second ``flurka train`` of a config compiled everything again. Unset,
    the cache is JAX's JAX_COMPILATION_CACHE_DIR, else one under the user's cache home; off: none."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation.cache_dir(None) == str(tmp_path / "xdg" / "flurka" / "jax")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert compilation.cache_dir(None) == str(tmp_path / "jax")
    assert compilation.cache_dir(str(tmp_path / "mine")) == str(tmp_path / "mine")
    assert compilation.cache_dir("off") is None
