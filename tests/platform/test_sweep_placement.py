"""Each trial records where it ran (node, device, peak memory) in the results database, and its
system metrics, sampled inside the trial, reach MLflow through Tune."""

from __future__ import annotations

import json
import socket

import sqlalchemy as sa
import pytest

from flurka.sweeps.runner import run_sweep
from flurka.sweeps.spec import SweepSpec
from flurka.sweeps.system_metrics import PREFIX, Sampler, placement


@pytest.mark.slow
def test_each_trial_records_its_node_device_and_memory(tmp_path, tiny_overrides, mlflow_runs, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.5,), steps=4,
                     overrides=tiny_overrides, baselines=False, run_dir=str(tmp_path / "run"), num_cpus=2,
                     name="placed")
    out = run_sweep(spec)
    assert not out.failed and not out.stopped
    host = socket.gethostname()
    for key, r in out.results.items():   # the base run too: its result says where it ran
        p = r["placement"]
        assert (p["node"], p["device"], p["platform"], p["device_count"]) == (host, "cpu", "cpu", 1), key
        assert p["peak_host_bytes"] > 0 and p["peak_device_bytes"] is None and p["node_id"], key

    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT node, device, device_count, peak_host_bytes, peak_device_bytes "
                                    "FROM trials")).all()
        env_host = conn.execute(sa.text("SELECT host FROM environments")).scalar_one()
    engine.dispose()
    assert rows and all(r.node == host and r.device == "cpu" and r.device_count == 1 and r.peak_host_bytes > 0
                        and r.peak_device_bytes is None for r in rows), rows
    assert env_host == host                               # the trials' node(s), not merely the driver's
    record = json.loads((out.run_dir / "sweep-record.json").read_text())
    assert all(t["node"] == host and t["peak_host_bytes"] > 0 for t in record["trials"])

    client, runs = mlflow_runs(out.mlflow_uri, "placed")
    branch = next(r for r in runs if r.info.run_name == "flurka-rnn a=0.5 dk=16 s0")
    system = {k for k in branch.data.metrics if k.startswith(PREFIX)}
    assert {"system/cpu_percent", "system/host_rss_bytes", "system/peak_host_bytes"} <= system
    history = client.get_metric_history(branch.info.run_id, "system/host_rss_bytes")
    assert len(history) >= 2 and all(m.value > 0 for m in history)
    assert branch.data.tags["node"] == host and branch.data.tags["device"]


def test_sampler_and_placement_on_cpu():
    import jax

    devices = jax.devices()
    sampler = Sampler(devices)
    sum(i * i for i in range(200_000))   # some CPU time between the samples
    values = sampler.sample()
    assert values[f"{PREFIX}cpu_percent"] >= 0 and values[f"{PREFIX}host_rss_bytes"] > 0
    assert values[f"{PREFIX}peak_host_bytes"] >= values[f"{PREFIX}host_rss_bytes"] * 0.5
    assert not any("device" in k or "gpu" in k for k in values)          # CPU: no allocator statistics
    p = placement(devices, node_ip="10.0.0.3", node_id="abcdef0123456789")
    assert (p["device"], p["platform"], p["node_id"], p["peak_device_bytes"]) == ("cpu", "cpu", "abcdef01", None)
