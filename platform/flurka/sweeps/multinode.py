"""One training run on several processes / nodes: Ray Train's ``JaxTrainer``.

Ray Train starts ``num_workers`` worker processes (one per node or per GPU), makes them one JAX
program with ``jax.distributed.initialize`` (process 0 is the coordinator), and runs
:func:`train_worker` in each. Every process then sees all processes' devices in
``jax.devices()``; :mod:`flurka.training.parallel` splits each global batch over that mesh, so the
run is data parallel across nodes and its loss curve is the single-device one.

Ray's own JAX backend initializes the distributed runtime only for TPUs and GPUs;
:class:`JaxDistributedConfig` does the same on CPU (gloo collectives), which is how this is
tested on a laptop and how CPU-only clusters run it.

    from flurka.sweeps.multinode import fit
    result = fit({"benchmark": "lra-listops-small", "overrides": {...}}, num_workers=2,
                 storage_path="/abs/shared/dir", name="listops-dp")
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import ray
from ray.train._internal.utils import get_address_and_port
from ray.train.v2.api.config import RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer
from ray.train.v2.jax.config import JaxConfig, _JaxBackend

from flurka import training
from flurka.configs import get_config


def _init_cpu(coordinator: str, num_processes: int, process_id: int) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id)


def _shutdown() -> None:
    jax.distributed.shutdown()


class _Backend(_JaxBackend):
    """Ray's JAX backend, plus ``jax.distributed`` on CPU-only workers."""

    def on_start(self, worker_group, backend_config: "JaxDistributedConfig") -> None:
        if backend_config.use_tpu or backend_config.use_gpu:
            return super().on_start(worker_group, backend_config)
        addr, port = worker_group.execute_single(0, get_address_and_port)
        n = len(worker_group)
        ray.get([worker_group.execute_single_async(i, _init_cpu, f"{addr}:{port}", n, i) for i in range(n)])

    def on_shutdown(self, worker_group, backend_config: "JaxDistributedConfig") -> None:
        if backend_config.use_tpu or backend_config.use_gpu:
            return super().on_shutdown(worker_group, backend_config)
        try:
            ray.get(worker_group.execute_async(_shutdown), timeout=30)
        except Exception:  # a worker that already died has nothing to shut down
            pass


@dataclasses.dataclass
class JaxDistributedConfig(JaxConfig):
    @property
    def backend_cls(self):
        return _Backend


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker loop: one flurka training run, data parallel over every process's
    devices. Every process computes the same metrics; ``report_dir`` gets each one's view."""
    cfg = get_config(config["benchmark"], **config.get("overrides", {}))
    result = training.run(cfg)   # the loop shards over every process's devices and checks batch_size
    info = {"process_index": jax.process_index(), "process_count": jax.process_count(),
            "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
            "status": result["status"], "losses": [h["loss"] for h in result["history"]],
            "steps": [h["step"] for h in result["history"]], "final_metrics": result["final_metrics"]}
    if config.get("report_dir"):  # shared storage on a real cluster
        path = Path(config["report_dir"]) / f"worker{jax.process_index()}.json"
        path.write_text(json.dumps(info))
    ray.train.report({k: v for k, v in info.items() if not isinstance(v, (list, dict))})


def fit(config: dict[str, Any], *, num_workers: int, use_gpu: bool = False, storage_path: str,
        name: str = "flurka-multinode", resources_per_worker: dict[str, float] | None = None):
    """Run :func:`train_worker` on ``num_workers`` processes as one JAX program; returns Ray
    Train's ``Result``. ``storage_path`` must be absolute (shared storage on a real cluster)."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if not os.path.isabs(storage_path):
        raise ValueError(f"storage_path must be absolute (Ray Train chdirs workers), got {storage_path!r}")
    env = {"JAX_PLATFORMS": "cuda" if use_gpu else "cpu"}
    trainer = JaxTrainer(
        train_worker, train_loop_config=config,
        jax_config=JaxDistributedConfig(use_gpu=use_gpu),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker=resources_per_worker or {"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=storage_path, worker_runtime_env={"env_vars": env}))
    return trainer.fit()


__all__ = ["fit", "train_worker", "JaxDistributedConfig"]
