"""Suite-wide set-up: how XLA compiles this suite's CPU programs, one cache for them, and the
collector's share of the time.

The suite is compile-bound (hundreds of small programs, Pallas kernels interpreted).

- ``--xla_backend_optimization_level=0``: LLVM's cheap pipeline. On a 2-core host it cut the
  suite from 42:17 to 37:40 (the fused layer's tests 200 -> 155 s). It changes code generation,
  not the computation: no fast math at either level, the same HLO passes, so the float64
  references and the exact-equality checks hold as they would at XLA's default. Compiles for a
  GPU target (``flurka.speed.aot``) pin the card's default level, since they report its registers.
- ``--xla_cpu_use_fusion_emitters=false``: XLA's CPU backend emits fusions with its elemental
  IR emitter, as it did before the MLIR fusion emitters, whose pipeline costs more per program
  than the program's run here: the suite 33:04 -> 28:49 on a 2-core host (test time 3895 ->
  3387 s; the fused kernels' file 259 -> 163 s), a tiny training run's process 16.6 -> 12.3 s.
  Both emitters are exact IEEE code (no fast math); the tolerances against float64 references
  are unchanged. Added only where this jaxlib knows the flag.
- ``JAX_COMPILATION_CACHE_DIR``: one persistent cache for the session, every program kept. The
  same programs are compiled again and again: by each test that builds the same model (a new
  function object misses JAX's in-memory caches, not this one), by both xdist workers, by every
  subprocess and every Ray trial (sweeps default to this variable when it is set). Entries are
  keyed by the program, the compiler options and the JAX version, so a hit is the executable a
  compile would give. Tests of the cache itself run their processes without it. With it the
  suite went from 37:40 to 34:02 on the same host (test time 4439 -> 4022 s).

Set before any test starts a backend, so xdist workers, subprocesses and Ray workers inherit
them; a user's own ``JAX_COMPILATION_CACHE_DIR`` is kept.

``gc.freeze()`` before each test, after a collection: the objects that outlive a test (JAX's
tracing and lowering caches, imported modules, module fixtures) leave the collector's
generations, so a collection scans only what the running test made. Late in the session an xdist
worker holds about two million tracked objects and a full collection of them takes about a
second; the speed runner collects after every point it measures (a GPU's memory is released
there): the tiny sweep's fixture spent 92 of its 106 s in the collector. With the freeze the
suite spent 29 s in the collector instead of 349 s, 23:45 -> 18:52 on a 2-core host. What a test
leaves in a cycle after its collection is never freed: 100 and 228 objects per worker over the
whole session.
"""

import gc
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _known_to_xla(*flags: str) -> bool:
    """Whether this jaxlib's XLA takes ``flags``: XLA aborts a process on an unknown one, and the
    emitter flag is an XLA internal that a later jaxlib may drop."""
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                           capture_output=True)
    return probe.returncode == 0


# One probe for the flags not set yet (none in xdist workers, which inherit them); one per flag
# only where XLA refuses the set.
_missing = [f for f in _FLAGS if f.split("=")[0] not in os.environ.get("XLA_FLAGS", "")]
if _missing and not _known_to_xla(*_missing):
    _missing = [f for f in _missing if _known_to_xla(f)]
if _missing:
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *_missing]).strip()

# Ray waits ~20 s (this many 1 s tries) for a new head's GCS to answer; two xdist workers each
# starting a cluster beside JAX compiles on 2 cores have run past that ("Failed to start GCS").
# Tests and the Ray nodes they start (which inherit it) wait up to 60 s.
os.environ.setdefault("RAY_NUM_REDIS_GET_RETRIES", "60")

_OWN_CACHE = None
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _OWN_CACHE = tempfile.mkdtemp(prefix="flurka-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


def pytest_runtest_setup(item):
    """Before the test's fixtures: collect what earlier tests left in cycles, freeze the rest."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    """The process that made the session's cache (xdist's controller, or a plain run) removes it."""
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def chromium_binary() -> str:
    """Headless Chromium for the pages a user opens (the report, the MLflow UI): support/browser.py."""
    import browser

    return browser.chromium_binary()
