"""Where the sweep runs: an embedded local Ray by default, or the cluster at ``--address`` /
``RAY_ADDRESS`` (which is what ``ray job submit`` sets for the driver).

Three things fail here, before any trial starts, with one readable line: an address nobody
answers on, a GPU request on a cluster that has no GPUs, and a run dir that not every node of
the cluster sees (:func:`check_shared_dir`).

The embedded instance records its session in the run dir (``ray-session.json``) while it runs: a
driver killed outright leaves Ray's dashboard and runtime-env agents running (they outlive the
raylet and ignore SIGTERM), and the next start in that run dir stops what used that session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import ray
from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from flurka import source

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
    session_record: Path | None = None   # the embedded instance's ray-session.json

    def close(self) -> None:
        if ray.is_initialized():
            ray.shutdown()
        if self.session_record is not None:
            self.session_record.unlink(missing_ok=True)

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


SESSION_RECORD = "ray-session.json"


def _uses(proc, session_dir: str) -> bool:
    """Whether a live process of this user belongs to that Ray session: names it on its command
    line or holds a file under it open (the agents, renamed ``ray::…``, keep their session's logs
    open). A process that ends (or is a zombie) meanwhile does not."""
    try:
        if proc.uids().real != os.getuid():
            return False
        if any(session_dir in part for part in proc.cmdline()):
            return True
        return any(f.path.startswith(session_dir + os.sep) for f in proc.open_files())
    except psutil.Error:   # NoSuchProcess, ZombieProcess, AccessDenied
        return False


def reap_orphans(run_dir: str | os.PathLike, *, grace_s: float = 3.0) -> int:
    """Stop what a killed driver's embedded Ray left running: the processes that use the session
    ``run_dir/ray-session.json`` records, if the driver that wrote it is gone. Only this user's
    processes of that one session are touched. Returns how many were stopped."""
    record = Path(run_dir) / SESSION_RECORD
    try:
        rec = json.loads(record.read_text())
        driver, session = int(rec["driver_pid"]), str(rec["session_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    if driver != os.getpid() and psutil.pid_exists(driver):
        return 0                      # its driver still runs: not ours to stop
    me = os.getpid()
    procs = [p for p in psutil.process_iter() if p.pid != me and _uses(p, session)]
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:                   # the agents ignore SIGTERM
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    record.unlink(missing_ok=True)
    return len(procs)


def _record_session(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = run_dir / SESSION_RECORD
    session = ray._private.worker._global_node.get_session_dir_path()   # no public accessor
    tmp = record.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"driver_pid": os.getpid(), "session_dir": session}))
    tmp.replace(record)
    return record


def quiet_termination() -> None:
    """Drop the ``SystemExit`` that Ray's SIGTERM handler raises when Tune ends a finished
    trial's process while Python runs a finalizer: Python can only report it ("Exception ignored
    in ... Traceback ... SystemExit: 1" in the sweep's output, a stack trace for a trial that
    went well). Any other exception a finalizer raises is reported as before.

    The sweep installs it as every Ray worker's setup hook, since Tune also ends trial processes
    that never reached the trainable (Ctrl-C while trials wait for a core); the trainable calls it
    too, which costs nothing where the hook already ran. It lives here, not beside the trainable,
    so that a worker that never runs a trial imports no JAX for it."""
    report = sys.unraisablehook
    if getattr(report, "quiet_termination", False):
        return

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, SystemExit):
            report(unraisable)

    hook.quiet_termination = True
    sys.unraisablehook = hook


def worker_env(gpus_per_trial: float = 0.0, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Env vars every Ray worker of the sweep gets (through ``runtime_env``, since shell env vars
    never reach the workers of an already-running cluster)."""
    env = dict(SHARED_GPU_ENV) if 0 < gpus_per_trial < 1 else {}
    env.update(extra or {})
    # A job's own runtime_env may already set some of these; its value wins, and Ray refuses
    # to merge two runtime_envs that name the same variable.
    return {k: v for k, v in env.items() if k not in os.environ}


def job_runtime_env(environ=os.environ) -> dict:
    """The runtime_env of the Ray job this driver runs in (``ray job submit``); {} outside one."""
    try:
        job = json.loads(environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR) or "{}").get("runtime_env") or {}
    except (ValueError, AttributeError):
        job = {}
    return job if isinstance(job, dict) else {}


def driver_runtime_env(env_vars: dict[str, str] | None, setup_hook: str | None,
                       environ=os.environ, cwd: str | None = None) -> dict | None:
    """ray.init's runtime_env: the env vars, the ``PYTHONPATH`` that makes every worker import the
    flurka this driver imports (:func:`flurka.source.worker_pythonpath`), and the setup hook;
    each unless the job this driver runs in names it (``ray job submit --runtime-env-json``): Ray
    merges the job's runtime env with ray.init's and refuses a field or env var both name, so the
    job's own then holds."""
    job = job_runtime_env(environ)
    env_vars = dict(env_vars or {})
    pythonpath = source.worker_pythonpath(job, cwd)
    if pythonpath and "PYTHONPATH" not in (job.get("env_vars") or {}):
        env_vars["PYTHONPATH"] = pythonpath
    runtime_env: dict = {"env_vars": env_vars} if env_vars else {}
    if setup_hook and "worker_process_setup_hook" not in job:
        runtime_env["worker_process_setup_hook"] = setup_hook
    return runtime_env or None


def _quiet_default_token_notice() -> None:
    """The embedded Ray keeps Ray's default (token auth on, a token made if none exists) but not
    its notice saying so on every start, which read as a problem in the sweep's output. Setting
    RAY_AUTH_MODE=token instead would silence it too, but then Ray makes no token."""
    log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DefaultTokenNotice) for f in log.filters):
        log.addFilter(_DefaultTokenNotice())


class _DefaultTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster.")


ONE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _one_node_on_loopback():
    """The embedded instance is one node nothing else joins, so every port of it stays on
    127.0.0.1 (README, "loopback-only"). Ray binds its GCS, raylet and agents to loopback only where
    the node's IP is 127.0.0.1, and puts the machine's address in its place unless its one-node
    switch (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, meant for Windows and macOS) is set: set while
    the node starts (its processes inherit it; this process reads Ray's copy, made at import),
    then put back, so a ``ray start`` this process runs later may still join a cluster."""
    from ray._private import ray_constants

    saved_env, saved_flag = os.environ.get(ONE_NODE_ENV), ray_constants.ENABLE_RAY_CLUSTER
    if saved_env is None:   # a user's own setting wins
        os.environ[ONE_NODE_ENV] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop(ONE_NODE_ENV, None)
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag


def connect(address: str | None = None, *, run_dir: str | os.PathLike, num_cpus: int | None = None,
            env_vars: dict[str, str] | None = None, setup_hook: str | None = None) -> ClusterContext:
    """Connect (or start) Ray. With no address and no ``RAY_ADDRESS``: a private local instance
    (``address="local"``, own temp dir, no dashboard) — never whatever cluster /tmp/ray records.

    ``setup_hook`` ("module.function") runs in every worker process as it starts, before any
    task or actor: what must hold for a process's whole life, not only while a trial runs."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    runtime_env = driver_runtime_env(env_vars, setup_hook)
    if address in (None, "local"):
        run_dir = Path(run_dir).resolve()
        stopped = reap_orphans(run_dir)
        if stopped:
            print(f"[flurka] stopped {stopped} Ray processes that a killed sweep in {run_dir} left running",
                  flush=True)
        temp_dir = _short_temp_dir(run_dir)
        _quiet_default_token_notice()
        with _one_node_on_loopback():
            ray.init(address="local", _temp_dir=temp_dir, include_dashboard=False, num_cpus=num_cpus,
                     runtime_env=runtime_env, log_to_driver=True, configure_logging=False)
        return ClusterContext("local", True, temp_dir, dict(ray.cluster_resources()),
                              _record_session(run_dir))
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


SHARED_DIR_WAIT_S = 5.0    # how long a node looks for the marker (an NFS client's attribute cache)


def _sees_marker(path: str, token: str, wait_s: float) -> str:
    """On one node: "yes" if the marker ``path`` holds ``token``, else what is there instead."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if Path(path).read_text() == token:
                return "yes"
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return "a different dir at that path" if Path(path).parent.is_dir() else "no such dir there"
        time.sleep(0.5)


def ask_each_node(nodes: list[dict], check, *args, timeout_s: float) -> list[tuple[dict, str]]:
    """Run ``check(*args)`` once on each of ``nodes`` (a task pinned to it, ``num_cpus=0``: it does
    not wait for a busy node's cores); the nodes whose answer is not "yes" — their task died, or
    gave no answer in ``timeout_s`` — with what they said."""
    remote = ray.remote(num_cpus=0, max_retries=0)(check)
    refs = {remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(*args): n for n in nodes}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    out = []
    for ref in ready:
        try:
            answer = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the node's task died: that node is named
            answer = f"its check failed: {type(exc).__name__}"
        if answer != "yes":
            out.append((refs[ref], answer))
    for ref in late:
        with contextlib.suppress(Exception):   # a lost node's task may not be cancellable
            ray.cancel(ref)
        out.append((refs[ref], f"no answer in {timeout_s:g}s"))
    return out


def name_nodes(failing: list[tuple[dict, str]]) -> str:
    """The nodes :func:`ask_each_node` found failing, for a one-line error."""
    return "; ".join(f"{n.get('NodeManagerAddress', '?')} (node {n['NodeID'][:8]}: {why})" for n, why in failing)


def check_shared_dir(run_dir: str | os.PathLike, *, embedded: bool, timeout_s: float = 60.0,
                     wait_s: float = SHARED_DIR_WAIT_S) -> None:
    """Every alive node of the cluster must see ``run_dir`` at the same path: forks and the model
    upload read ``<run-dir>/work`` on whichever node runs them. The driver writes a uniquely
    named marker there and one task pinned to each node (``num_cpus=0``: it does not wait for a
    busy node's cores) reads it back; a node that cannot, or does not answer in ``timeout_s``, is
    named in one line (ClusterError). Nothing to check on the embedded instance, nor on a cluster
    whose one node is the driver's own. Nodes that join later are not checked."""
    if embedded:
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not nodes or [n["NodeID"] for n in nodes] == [ray.get_runtime_context().get_node_id()]:
        return
    run_dir = Path(run_dir).resolve()
    token = uuid.uuid4().hex
    marker = run_dir / f".flurka-shared-{token}"
    marker.write_text(token)
    try:
        blind = ask_each_node(nodes, _sees_marker, str(marker), token, wait_s, timeout_s=timeout_s)
    finally:
        marker.unlink(missing_ok=True)
    if blind:
        raise ClusterError(f"--run-dir {run_dir} is not shared with {len(blind)} of the cluster's {len(nodes)} "
                           f"nodes: {name_nodes(blind)}; the run dir must be on storage every node mounts at the same "
                           f"path (NFS, a shared volume): forks and the model upload read <run-dir>/work "
                           f"on whichever node runs them")


def concurrent_trials(resources: dict[str, float], cpus_per_trial: float, gpus_per_trial: float) -> int:
    """How many trials of this size the cluster runs at once (at least one)."""
    fits = [float(resources.get("CPU", 0.0)) / cpus_per_trial]
    if gpus_per_trial > 0:
        fits.append(float(resources.get("GPU", 0.0)) / gpus_per_trial)
    return max(1, int(min(fits) + 1e-9))


__all__ = ["connect", "driver_runtime_env", "job_runtime_env", "check_reachable", "check_resources", "check_shared_dir",
           "concurrent_trials", "worker_env",
           "quiet_termination", "ClusterContext", "ClusterError", "SHARED_GPU_ENV"]
