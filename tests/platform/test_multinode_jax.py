"""Ray Train's JaxTrainer with 2 CPU workers: one JAX program across 2 processes
(``jax.distributed``), data parallel, with the single-process loss curve."""

from __future__ import annotations

import json
import shutil
import tempfile

import numpy as np
import pytest

OVERRIDES = dict(steps=6, warmup_steps=0, eval_every=0, log_every=1, batch_size=8, eval_batches=1,
                 model=dict(attention="linformer", d_model=16, d_ff=32, num_layers=1))


@pytest.mark.slow
def test_two_worker_jax_trainer(tmp_path):
    import ray

    from flurka import training
    from flurka.configs import get_config
    from flurka.sweeps.multinode import fit

    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    temp_dir = tempfile.mkdtemp(prefix="frk-mn-", dir="/tmp")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, configure_logging=False)
    try:
        result = fit({"benchmark": "lra-listops-small", "overrides": OVERRIDES, "report_dir": str(report_dir)},
                     num_workers=2, storage_path=str(tmp_path / "train"), name="dp2")
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert result.error is None
    workers = [json.loads((report_dir / f"worker{i}.json").read_text()) for i in range(2)]
    assert [w["process_index"] for w in workers] == [0, 1] and {w["status"] for w in workers} == {"ok"}
    assert all(w["process_count"] == 2 and w["device_count"] == 2 and w["local_device_count"] == 1
               for w in workers)
    assert workers[0]["losses"] == workers[1]["losses"]            # one program, one curve

    alone = training.run(get_config("lra-listops-small", **OVERRIDES))   # one process, one device
    assert workers[0]["steps"] == [h["step"] for h in alone["history"]] == list(range(1, 7))
    np.testing.assert_allclose(workers[0]["losses"], [h["loss"] for h in alone["history"]], rtol=1e-5)


def test_bad_arguments_fail_before_ray():
    from flurka.sweeps.multinode import fit

    with pytest.raises(ValueError, match="num_workers"):
        fit({}, num_workers=0, storage_path="/abs")
    with pytest.raises(ValueError, match="absolute"):
        fit({}, num_workers=2, storage_path="relative/dir")
