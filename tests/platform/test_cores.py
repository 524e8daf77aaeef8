"""A CPU trial's cores: distinct slots per process, every thread pinned, None when none is free."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading

import pytest

from flurka.cluster import cores

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")


def _claim(lock_dir, n, ready, release, out):
    started = threading.Thread(target=release.wait)    # a thread older than the pin
    started.start()
    got = cores.pin(n, lock_dir=lock_dir)
    again = cores.pin(n, lock_dir=lock_dir)             # a reused worker keeps its slot
    threads = [os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")]
    out.put((got, again, threads, os.sched_getaffinity(started.native_id)))
    ready.set()
    release.wait()
    started.join()


def test_processes_get_distinct_cores_until_none_is_free(tmp_path):
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        pytest.skip("needs 2 cores to claim one of them")
    ctx = mp.get_context("spawn")
    release, out, procs = ctx.Event(), ctx.Queue(), []
    claims = []
    for _ in range(len(available) + 1):      # one more process than there are cores
        ready = ctx.Event()
        p = ctx.Process(target=_claim, args=(str(tmp_path), 1, ready, release, out))
        p.start()
        procs.append(p)
        assert ready.wait(60)
        claims.append(out.get(timeout=10))
    release.set()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0

    pinned = [c for c in claims if c[0] is not None]
    assert sorted(c[0] for c in pinned) == [(core,) for core in available]   # one core each
    assert [c[0] for c in claims].count(None) == 1                          # the extra one: as it was
    for got, again, threads, older in pinned:
        assert again == got
        assert all(t == set(got) for t in threads) and older == set(got)   # every thread, old ones too
    unpinned = next(c for c in claims if c[0] is None)
    assert unpinned[3] == set(available)


def test_a_dead_process_frees_its_slot(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores to claim one of them")
    ctx = mp.get_context("spawn")
    firsts = []
    for _ in range(2):                        # the same slot twice, one process after the other
        ready, release, out = ctx.Event(), ctx.Event(), ctx.Queue()
        p = ctx.Process(target=_claim, args=(str(tmp_path), 1, ready, release, out))
        p.start()
        firsts.append(out.get(timeout=60)[0])
        release.set()
        p.join(30)
        assert p.exitcode == 0
    assert firsts[0] == firsts[1] == (min(os.sched_getaffinity(0)),)


@pytest.mark.parametrize("n", [0, 10_000])
def test_no_pin_for_a_fraction_or_every_core(tmp_path, n):
    assert cores.pin(n, lock_dir=tmp_path) is None
    assert not list(tmp_path.iterdir())
