"""Helpers shared by several test directories (on pytest's ``pythonpath``, see pyproject)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path


def pids_naming(marker: str) -> list[int]:
    """PIDs of processes whose command line names ``marker`` (a test's own temp/run dir), so a test
    stops exactly the Ray processes it started — never `ray stop`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                out.append(int(pid))
        except OSError:
            pass
    return [p for p in out if p != os.getpid()]


def wait_ray_node(proc: subprocess.Popen, ready, what: str, timeout_s: float) -> None:
    """Poll ``ready()`` (a port that answers, a URL) until it holds; an AssertionError with `ray
    start`'s output if the node exits first, or naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"ray start exited with {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
        try:
            if ready():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not come up in {timeout_s:.0f}s")
        time.sleep(0.5)


class JoiningNode:
    """A ``ray start --address`` child (``start()`` launches it) given one more try when Ray's fixed 30 s
    wait for a joining raylet to register runs out on a loaded host; the operator's answer is the same:
    run the same command again. Any other exit, or a second one, fails with its output."""

    def __init__(self, start):
        self._start, self.proc, self.restarted = start, start(), False

    def check(self) -> None:
        if self.proc.poll() is None:
            return
        out = self.proc.stdout.read()
        assert "timed out during startup" in out and not self.restarted, f"the joining node exited:\n{out[-3000:]}"
        with contextlib.suppress(ProcessLookupError):   # its raylet, where it outlived `ray start`
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc, self.restarted = self._start(), True


def stop_ray_node(proc: subprocess.Popen, temp_dir: str) -> list[int]:
    """Stop one `ray start --block` by its process group (it stops what it started), then kill
    whatever of its node is left (processes naming its own ``temp_dir``: never another's) and
    remove the temp dir; the PIDs that had to be killed."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    time.sleep(1)
    leftovers = pids_naming(temp_dir)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)
    return leftovers


@contextlib.contextmanager
def scratch_postgres_database(admin_url: str, prefix: str) -> Iterator[str]:
    """URL of a fresh database on the server of ``admin_url`` (FLURKA_TEST_POSTGRES_URL), dropped
    on exit even if connections are still open."""
    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS hands out now (from its ephemeral range)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def worker_port_range(size: int = 41, avoid: tuple[int, int] | None = None) -> tuple[int, int]:
    """(min, max) of ``size`` free ports *below* the OS's ephemeral range, so no port from
    `free_ports` (nor any port the OS picks for Ray's own "random" components) can fall inside it:
    Ray refuses to start when a component's port is in the worker range (seen in CI)."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    for _ in range(200):
        low = random.randrange(10000, ephemeral_low - size)
        high = low + size - 1
        if avoid and not (high < avoid[0] or low > avoid[1]):
            continue
        if all(_bindable(p) for p in range(low, high + 1)):
            return low, high
    raise RuntimeError(f"no {size} consecutive free ports below {ephemeral_low}")


def ray_node_ports(head: bool, avoid: tuple[int, int] | None = None) -> tuple[list[str], dict[str, int]]:
    """`ray start` flags pinning every port of one node (head: also GCS, dashboard and client) to
    distinct free ports, the worker range disjoint from all of them (and from ``avoid``, another
    node's worker range on this machine). Returns the flags and the ports by flag name."""
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port"]
    if head:
        names = ["port", "dashboard-port", "ray-client-server-port", *names]
    ports = dict(zip(names, free_ports(len(names))))
    ports["min-worker-port"], ports["max-worker-port"] = worker_port_range(avoid=avoid)
    return [a for name, port in ports.items() for a in (f"--{name}", str(port))], ports


@contextlib.contextmanager
def ray_auth_disabled() -> Iterator[None]:
    """This process as a client of a dev cluster started with ``RAY_AUTH_MODE=disabled``. Ray
    caches the mode in its process-wide config when a client connects; restoring the variable
    alone would leave a later local ``ray.init`` of this process (its GCS started in token mode)
    a client without a token: "Failed to start GCS ... InvalidAuthToken". So the config is read
    again from the restored environment on the way out."""
    from unittest import mock

    from ray._raylet import Config

    try:
        with mock.patch.dict(os.environ, {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}):
            os.environ.pop("RAY_ADDRESS", None)
            yield
    finally:
        Config.initialize("")


def private_mounts_refused(folder: Path) -> str | None:
    """Why this machine cannot hide ``folder`` from one process (no unshare, not permitted), or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "none",
                            str(folder)], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"cannot mount in a private mount namespace here: {probe.stderr.strip() or probe.returncode}"
    return None


@contextlib.contextmanager
def two_node_cluster(hidden: Path, *, hide: bool = True, env: dict[str, str] | None = None,
                     prefix: str = "frk") -> Iterator[types.SimpleNamespace]:
    """A real 2-node Ray cluster on this machine: a head and a second node on 127.0.0.1 (every
    port pinned free, own temp dirs, auth disabled; stopped by process group, never ``ray stop``),
    ``env`` added to the environment both ``ray start`` run in, as a real cluster's nodes carry
    theirs. With ``hide``, the second node runs in a private mount namespace where an empty tmpfs
    covers ``hidden``: a folder there is a node-local disk, anywhere else in /tmp shared storage.
    This process is connected to the head as a driver. Yields (address, env, the second node's
    ``ray.nodes()`` entry, every alive node's)."""
    import ray

    bin_dir = Path(sys.executable).parent
    head_tmp, node_tmp = (tempfile.mkdtemp(prefix=f"{prefix}-{n}-", dir="/tmp") for n in "hn")  # short: sockets
    head_flags, head_ports = ray_node_ports(head=True)
    node_flags, node_ports = ray_node_ports(head=False, avoid=(head_ports["min-worker-port"],
                                                               head_ports["max-worker-port"]))
    address = f"127.0.0.1:{head_ports['port']}"
    node_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    node_env.update(RAY_AUTH_MODE="disabled", PATH=f"{bin_dir}{os.pathsep}{node_env.get('PATH', '')}",
                    RAY_USAGE_STATS_ENABLED="0", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",  # else a drain waits 30 s
                    **(env or {}))
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    popen = dict(env=node_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    procs: list[tuple[subprocess.Popen, str]] = []
    leftovers: list[int] = []
    node = None
    try:
        head = subprocess.Popen([str(bin_dir / "ray"), "start", "--head", *common, *head_flags,
                                 "--include-dashboard", "false", "--temp-dir", head_tmp], **popen)
        procs.append((head, head_tmp))
        gcs = head_ports["port"]
        wait_ray_node(head, lambda: bool(socket.create_connection(("127.0.0.1", gcs), timeout=2).close() or 1),
                      f"the head's GCS on port {gcs}", 120)
        node_cmd = [str(bin_dir / "ray"), "start", "--address", address, *common, *node_flags, "--temp-dir", node_tmp]
        if hide:
            node_cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs none "$0" && exec "$@"', str(hidden), *node_cmd]
        node = JoiningNode(lambda: subprocess.Popen(node_cmd, **popen))
        with ray_auth_disabled():
            ray.init(address=address, configure_logging=False, log_to_driver=False)
            try:
                deadline = time.monotonic() + 120
                while len(alive := [n for n in ray.nodes() if n["Alive"]]) < 2:
                    node.check()
                    assert time.monotonic() < deadline, f"the second node did not join: {alive}"
                    time.sleep(1)
                second = next(n for n in alive if n["NodeManagerPort"] == node_ports["node-manager-port"])
                yield types.SimpleNamespace(address=address, env=node_env, second=second,
                                            nodes=[n["NodeID"] for n in alive])
            finally:
                ray.shutdown()
    finally:
        if node is not None:
            procs.append((node.proc, node_tmp))
        for proc, temp_dir in reversed(procs):
            leftovers += stop_ray_node(proc, temp_dir)
    assert not leftovers, f"node processes survived the stop: {leftovers}"


def listening(owned) -> list[tuple[str, str]]:
    """(process name, local address) of every TCP socket a process ``owned(pid)`` says is its
    listens on, by ``ss -ltnp``."""
    out = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+)', line):
            with contextlib.suppress(ProcessLookupError):
                if owned(int(pid)):
                    out.append((name, line.split()[3]))
    return out


def off_loopback(sockets: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Those of :func:`listening`'s sockets that listen anywhere but 127.0.0.1."""
    return [(name, a) for name, a in sockets if not a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:"))]


REPO = Path(__file__).resolve().parents[2]
CUDA_AOT = REPO / ".cuda-aot"
RECORDED = REPO / "benchmarks" / "results"   # the leases' and CPU runs' result files, as committed


def run_with_cuda_compiler(args: list[str], *, with_compiler: bool = True, timeout: int = 600):
    """``python args`` in the repository with XLA's CUDA compiler importable (``make test``
    installs it under ``.cuda-aot``): in a subprocess, since it must be importable before JAX
    starts and the test process's JAX has started without it."""
    if with_compiler and not (CUDA_AOT / ".installed").exists():
        import pytest
        pytest.fail(f"{CUDA_AOT} is missing: `make test` installs XLA's CUDA compiler there")
    env = {**os.environ, "PYTHONPATH": str(CUDA_AOT) if with_compiler else ""}
    env.pop("JAX_PLATFORMS", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout)


def cuda_compiler_script(body: str, tmp_path: Path):
    """``body`` (a script writing JSON to the path in its argv[1]) run by
    :func:`run_with_cuda_compiler`; its JSON read back."""
    out = tmp_path / "out.json"
    proc = run_with_cuda_compiler(["-c", textwrap.dedent(body), str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


LAUNCH_FIELDS = ("name", "grid_x", "grid_y", "grid_z", "num_stages", "num_warps")


def triton_calls(fn, *args, fields=LAUNCH_FIELDS) -> list[dict[str, str]]:
    """The Pallas (Triton) kernels of ``jit(fn)(*args)`` lowered for a CUDA GPU — no GPU needed —
    each as its launch ``fields`` (name, grid, stages, warps: strings as the lowering writes
    them), in program order."""
    import jax
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    pattern = rf'({"|".join(fields)}) = "?(\w+)"?'
    return [dict(re.findall(pattern, line))
            for line in text.split("\n") if "@__gpu$xla.gpu.triton" in line]


def flurka(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """``flurka ARGV`` typed in ``cwd``, in this process (the console script is
    ``flurka.cli:main``): (exit code, stdout, stderr)."""
    from flurka.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()
