"""Data parallel over 4 host devices gives the 1-device loss curve (jit follows the batch's
sharding; XLA's all-reduce makes the gradient the global-batch mean)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent("""
    import json, os
    import jax, numpy as np
    assert jax.device_count() == 4, jax.devices()
    from flurka.configs import get_config
    from flurka.training import loop, parallel

    cfg = get_config("lra-listops-small", steps=10, warmup_steps=0, eval_every=0, log_every=1, batch_size=8,
                     eval_batches=1, model=dict(attention="linformer", d_model=16, d_ff=32, num_layers=1))
    one = loop.train(cfg, mesh=None)           # one device
    mesh = parallel.data_mesh()
    try:
        parallel.check_batch_size(6, mesh)
        error = None
    except ValueError as exc:
        error = str(exc)
    plain, seen = loop._device_batch, []

    def spy(batch, mesh):                      # record how the loop placed each train batch
        out = plain(batch, mesh)
        if "example_weight" not in batch:
            seen.append(sorted({len(v.sharding.device_set) for v in out.values()}))
            seen.append(sorted({v.addressable_shards[0].data.shape[0] for v in out.values()}))
        return out

    loop._device_batch = spy
    four = loop.train(cfg)                     # default: split over every device
    print("RESULT" + json.dumps({"one": [h["loss"] for h in one["history"]],
                                 "four": [h["loss"] for h in four["history"]],
                                 "steps": [h["step"] for h in four["history"]], "seen": seen[:2], "error": error,
                                 "final": [one["final_metrics"], four["final_metrics"]]}))
""")


@pytest.mark.slow
def test_four_host_devices_match_one():
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")]
    r = json.loads(line.removeprefix("RESULT"))
    assert r["seen"] == [[4], [2]]                     # every array split over 4 devices, 2 examples each
    assert r["steps"] == list(range(1, 11))
    assert r["error"] == "batch_size=6 does not split over 4 devices; use a multiple of 4 (e.g. 4)"
    np.testing.assert_allclose(r["four"], r["one"], rtol=1e-5)
    assert r["final"][1] == pytest.approx(r["final"][0], rel=1e-5)


def test_no_mesh_is_a_no_op():
    from flurka.training import parallel

    batch = {"inputs": np.arange(6).reshape(3, 2)}
    assert parallel.shard_batch(batch, None) is batch and parallel.replicate(batch, None) is batch
