"""Issue 59, time to the first step: what a short ``flurka train`` compiles and imports before it
trains, and that cutting it changed no result (benchmarks/first_step.py times it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
from training_helpers import tiny

from flurka.training import loop
from flurka.training.optimizer import make_optimizer
from flurka.training.tasks import make_task

# A 2-step run in a fresh process without the persistent cache: the programs it compiles, and
# whether Orbax was imported (the run has no work dir, so it never checkpoints).
PROGRAM = textwrap.dedent("""
    import contextlib, io, json, sys
    import flurka.cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = flurka.cli.main(sys.argv[1:])
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    print(json.dumps({"rc": rc, "compilation": result["compilation"], "history": result["history"],
                      "orbax": sorted(m for m in sys.modules if m.split(".")[0] == "orbax")}))
""")
# 2026-12-07, lra-listops-small's flurka-rnn at one layer: 41 programs before the optimizer's zeros
# became one program (34 after): the data stage, the run's root key (4), the parameters' eager
# initialisers (19), the optimizer state (1), the train step, the learning rate of the first
# history entry (7) and the eval step.
MAX_PROGRAMS = 34


def _two_steps() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    argv = ["train", "--benchmark", "lra-listops-small", "--attention", "flurka-rnn", "--steps", "2", "--json",
            "--no-progress", "--compilation-cache", "off", "--set", "model.d_model=16", "--set", "model.d_ff=32",
            "--set", "model.num_layers=1", "--set", "batch_size=4", "--set", "eval_every=0", "--set", "eval_batches=1"]
    out = subprocess.run([sys.executable, "-c", PROGRAM, *argv], capture_output=True, text=True, check=True,
                         env={**env, "JAX_PLATFORMS": "cpu"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_two_step_run_compiles_few_programs_and_never_imports_orbax():
    run = _two_steps()
    assert run["rc"] == 0 and len(run["history"]) == 1
    assert 0 < run["compilation"]["compiles"] <= MAX_PROGRAMS, run["compilation"]
    assert run["orbax"] == [], "Orbax is imported by the first checkpointer only (flurka.training.checkpoints)"


def test_the_optimizer_state_is_what_eager_init_gives_bit_for_bit(digits):
    """The phase's AdamW state, built as one jitted program, equals ``tx.init`` run eagerly: same
    pytree (optax's namedtuples), dtypes and zeros; a training step from each agrees bit for bit."""
    config = tiny(model=dict(attention="flurka-performer"))
    tx = make_optimizer(config)
    phase = loop.make_phase(config, digits.info, config.model.attention, make_task(config), tx)
    eager = tx.init(phase.params)
    assert jax.tree.structure(phase.opt_state) == jax.tree.structure(eager)
    for a, b in zip(jax.tree.leaves(phase.opt_state), jax.tree.leaves(eager), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    batch = loop._device_batch(next(digits.train_batches(config.batch_size)))
    key = jax.random.key(3)
    from_jit = phase.train_step(phase.params, phase.other, phase.opt_state, batch, key)
    from_eager = phase.train_step(phase.params, phase.other, eager, batch, key)
    for a, b in zip(jax.tree.leaves(from_jit), jax.tree.leaves(from_eager), strict=True):
        np.testing.assert_array_equal(a, b)
