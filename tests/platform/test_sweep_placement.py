"""The sampler of a trial's system metrics and where it ran, on a CPU (a sweep's records of both:
test_sweep_local.check_placement, on its end-to-end sweep)."""

from __future__ import annotations

from flurka.sweeps.system_metrics import PREFIX, Sampler, placement


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
