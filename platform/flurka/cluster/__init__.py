"""Where the sweep runs: an embedded local Ray by default, or the cluster at ``--address`` /
``RAY_ADDRESS`` (which is what ``ray job submit`` sets for the driver).

Two things fail here, before any trial starts, with one readable line: an address nobody
answers on, and a GPU request on a cluster that has no GPUs.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

# Several trials share one GPU only if XLA does not grab 75% of it at start-up.
SHARED_GPU_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}


class ClusterError(RuntimeError):
    """The cluster cannot run this sweep (unreachable, or lacks the resources asked for)."""


@dataclasses.dataclass
class ClusterContext:
    address: str                 # what ray.init connected to ("local" for the embedded one)
    embedded: bool               # True when this process started (and owns) the Ray instance
    temp_dir: str | None         # the embedded instance's own temp dir
    resources: dict[str, float]  # ray.cluster_resources() at connect time

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "ClusterContext":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` of a GCS / Ray-client / dashboard address; None for 'auto'-style ones."""
    rest = address.split("://", 1)[-1].rstrip("/")
    if ":" not in rest:
        return None
    host, _, port = rest.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Raise ClusterError in one line if nothing listens at ``address`` (ray.init would otherwise
    retry for a minute and end in a stack trace)."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout_s):
            pass
    except OSError as exc:
        raise ClusterError(f"Ray cluster at {address!r} is unreachable ({exc.strerror or exc}); "
                           "start it or fix --address / RAY_ADDRESS") from None


def _short_temp_dir(run_dir: Path) -> str:
    """Ray's unix sockets live under the temp dir and must stay under ~107 bytes."""
    candidate = run_dir / "ray"
    if len(str(candidate)) <= 40:
        candidate.mkdir(parents=True, exist_ok=True)
        return str(candidate)
    return tempfile.mkdtemp(prefix="flurka-ray-")


def worker_env(gpus_per_trial: float = 0.0, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Env vars every Ray worker of the sweep gets (through ``runtime_env``, since shell env vars
    never reach the workers of an already-running cluster)."""
    env = dict(SHARED_GPU_ENV) if 0 < gpus_per_trial < 1 else {}
    env.update(extra or {})
    # A job's own runtime_env may already set some of these; its value wins, and Ray refuses
    # to merge two runtime_envs that name the same variable.
    return {k: v for k, v in env.items() if k not in os.environ}


def connect(address: str | None = None, *, run_dir: str | os.PathLike, num_cpus: int | None = None,
            env_vars: dict[str, str] | None = None) -> ClusterContext:
    """Connect (or start) Ray. With no address and no ``RAY_ADDRESS``: a private local instance
    (``address="local"``, own temp dir, no dashboard) — never whatever cluster /tmp/ray records."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    runtime_env = {"env_vars": dict(env_vars)} if env_vars else None
    if address in (None, "local"):
        temp_dir = _short_temp_dir(Path(run_dir).resolve())
        ray.init(address="local", _temp_dir=temp_dir, include_dashboard=False, num_cpus=num_cpus,
                 runtime_env=runtime_env, log_to_driver=True, configure_logging=False)
        return ClusterContext("local", True, temp_dir, dict(ray.cluster_resources()))
    if address != "auto":
        check_reachable(address)
    try:
        ray.init(address=address, runtime_env=runtime_env, configure_logging=False)
    except (ConnectionError, TimeoutError) as exc:
        raise ClusterError(f"cannot connect to Ray at {address!r}: {str(exc).splitlines()[0]}") from None
    return ClusterContext(address, False, None, dict(ray.cluster_resources()))


def check_resources(resources: dict[str, float], *, cpus_per_trial: float, gpus_per_trial: float) -> None:
    """One trial must fit the cluster; a GPU request on a CPU-only cluster is a spec error."""
    gpus = float(resources.get("GPU", 0.0))
    cpus = float(resources.get("CPU", 0.0))
    if gpus_per_trial > 0 and gpus == 0:
        raise ClusterError(f"--gpus-per-trial {gpus_per_trial:g} requested but the Ray cluster has no GPUs "
                           f"(resources: {cpus:g} CPU); use --gpus-per-trial 0")
    if gpus_per_trial > gpus:
        raise ClusterError(f"--gpus-per-trial {gpus_per_trial:g} exceeds the cluster's {gpus:g} GPUs")
    if cpus_per_trial > cpus:
        raise ClusterError(f"--cpus-per-trial {cpus_per_trial:g} exceeds the cluster's {cpus:g} CPUs")


__all__ = ["connect", "check_reachable", "check_resources", "worker_env", "ClusterContext", "ClusterError",
           "SHARED_GPU_ENV"]
