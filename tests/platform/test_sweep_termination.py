"""A trial's process ended by Tune prints no stack trace: Ray's SIGTERM handler raises
SystemExit, and where that lands in a finalizer Python reports it as "Exception ignored in"
with a traceback (seen at the end of every `make sweep` phase)."""

from __future__ import annotations

import subprocess
import sys

from flurka.sweeps.trainable import WORKER_SETUP_HOOK

SCRIPT = """
import sys
from flurka.sweeps.trainable import quiet_termination
if sys.argv[1] == "quiet":
    quiet_termination()
    quiet_termination()                    # idempotent: one hook, not a chain of them

class Exits:
    def __del__(self):
        raise SystemExit(1)                # what Ray's handler raises inside a finalizer

class Fails:
    def __del__(self):
        raise ValueError("a real error")

e = Exits(); del e
f = Fails(); del f
print("alive")
"""


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                          timeout=120, check=True)


def test_the_trainable_drops_only_the_termination_from_finalizers():
    loud, quiet = _run("loud"), _run("quiet")
    assert loud.stdout == quiet.stdout == "alive\n"
    assert "SystemExit" in loud.stderr and "ValueError: a real error" in loud.stderr
    assert "SystemExit" not in quiet.stderr
    assert quiet.stderr.count("Exception ignored") == 1          # the ValueError, still reported
    assert "ValueError: a real error" in quiet.stderr


def test_every_worker_of_the_sweeps_cluster_drops_it_before_any_trial(tmp_path):
    """Tune also ends trial processes that never reached the trainable (Ctrl-C while the trials
    wait for a core): the hook must be in place as the worker process starts."""
    import ray

    from flurka.cluster import connect

    @ray.remote(num_cpus=0)
    class Probe:
        def installed(self) -> bool:
            return bool(getattr(sys.unraisablehook, "quiet_termination", False))

    @ray.remote(num_cpus=0)
    def installed() -> bool:
        return bool(getattr(sys.unraisablehook, "quiet_termination", False))

    for setup_hook, expected in ((WORKER_SETUP_HOOK, True), (None, False)):
        connect(run_dir=tmp_path / str(expected), num_cpus=1, setup_hook=setup_hook)
        try:
            assert ray.get(Probe.remote().installed.remote(), timeout=120) is expected
            assert ray.get(installed.remote(), timeout=120) is expected
        finally:
            ray.shutdown()


def test_a_job_that_names_its_own_setup_hook_keeps_it():
    """Under ``ray job submit`` with a runtime env naming a hook, Ray would refuse ray.init's
    (it merges the job's runtime env with the driver's and refuses a field both name): the
    driver then leaves the sweep's out, and the trainable's own call still quiets the trials."""
    import json

    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    from flurka import source
    from flurka.cluster import driver_runtime_env

    def job(runtime_env):
        return {RAY_JOB_CONFIG_JSON_ENV_VAR: json.dumps({"runtime_env": runtime_env, "metadata": {}})}

    ours = {"env_vars": {"A": "1", "PYTHONPATH": source.worker_pythonpath({})},
            "worker_process_setup_hook": WORKER_SETUP_HOOK}
    assert driver_runtime_env({"A": "1"}, WORKER_SETUP_HOOK, environ={}) == ours
    assert driver_runtime_env({"A": "1"}, WORKER_SETUP_HOOK, environ=job({"env_vars": {"B": "2"}})) == ours
    theirs = driver_runtime_env(None, WORKER_SETUP_HOOK, environ=job({"worker_process_setup_hook": "theirs.hook"}))
    assert theirs == {"env_vars": {"PYTHONPATH": source.worker_pythonpath({})}}
    # nor the job's own PYTHONPATH: Ray refuses an env var both name
    assert driver_runtime_env(None, None, environ=job({"env_vars": {"PYTHONPATH": "mine"}})) is None
