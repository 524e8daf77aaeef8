"""One training per work dir at a time: Optuna can draw the same planned run twice, and two
trainings writing one orbax checkpoint directory collide (a CI failure of the Optuna+ASHA test)."""

from __future__ import annotations

import fcntl
import subprocess
import sys

from flurka.sweeps.trainable import exclusive

HOLD_NB = ("import fcntl, sys; f = open(sys.argv[1], 'w')\n"
           "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('acquired')\n"
           "except BlockingIOError:\n    print('busy')")


def _other_process_tries(path) -> str:
    return subprocess.run([sys.executable, "-c", HOLD_NB, str(path)], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_work_dir_is_trained_by_one_process_at_a_time(tmp_path):
    lock = tmp_path / ".lock"
    with exclusive(tmp_path):
        assert _other_process_tries(lock) == "busy"
        with open(lock, "w") as again:          # another trial in the same (reused) actor, too
            try:
                fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("a second holder in the same process got the lock")
            except BlockingIOError:
                pass
    assert _other_process_tries(lock) == "acquired"   # released on exit


HOLD_DRIVER = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)")


def test_a_run_dir_is_driven_by_one_sweep_at_a_time(tmp_path):
    """Issue 60: two concurrent --resume on one run dir both trained every remaining trial. A
    second driver is refused before anything starts, naming the first's pid and command, and
    writes nothing; the lock goes with its holder (killed here: the kernel drops it), and the
    next driver takes it."""
    import os

    import pytest

    from flurka.sweeps.runner import preflight, unlock_run_dir
    from flurka.sweeps.spec import SpecError, from_args

    run_dir = tmp_path / "rd"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_DRIVER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for resume in (True, False):
            spec = from_args({"benchmarks": ["lra-listops-small"], "run_dir": str(run_dir), "resume": resume})
            with pytest.raises(SpecError, match=rf"^--run-dir .*/rd is in use by another sweep driver "
                                                rf"\(pid {holder.pid}: .*python.*\): wait for it to end"):
                preflight(spec)
        assert list(run_dir.iterdir()) == []           # nothing written
    finally:
        holder.kill()
        holder.wait()
    spec = from_args({"benchmarks": ["lra-listops-small"], "run_dir": str(run_dir)})
    _, _, engine = preflight(spec)
    engine.dispose()
    try:
        again = subprocess.run([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                                "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('acquired')\n"
                                "except BlockingIOError:\n    print('busy')", str(run_dir)],
                               capture_output=True, text=True, check=True).stdout.strip()
        assert again == "busy" and os.getpid() != holder.pid
    finally:
        unlock_run_dir(run_dir)


def test_a_run_dir_that_cannot_be_locked_is_used_with_a_warning(tmp_path, monkeypatch, capsys):
    """A file system without flock on directories (ENOLCK on some NFS mounts) is not a reason to
    refuse a shared run dir: one line says it is not locked, and the sweep goes on."""
    import errno
    import os

    from flurka.sweeps import runner

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    runner.lock_run_dir(tmp_path)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--run-dir {tmp_path}: not locked (No locks available)" in err
    assert tmp_path.resolve() not in runner._held
    runner.unlock_run_dir(tmp_path)                       # nothing held: nothing to release
