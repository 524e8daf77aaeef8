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
