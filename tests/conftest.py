"""Suite-wide set-up: XLA compiles this suite's CPU programs with LLVM's cheap pipeline.

The suite is compile-bound (hundreds of small programs, Pallas kernels interpreted), and
``--xla_backend_optimization_level=0`` cut it on a 2-core host from 42:17 to 37:40 (the fused
layer's tests 200 -> 155 s). It changes code
generation, not the computation: no fast math at either level, the same HLO passes, so the
float64 references and the exact-equality checks hold as they would at XLA's default. Set
before any test starts a backend, so subprocesses and Ray workers inherit it. Compiles for a
GPU target (``flurka.speed.aot``) pin the card's default level, since they report its registers.
"""

import os

_FLAG = "--xla_backend_optimization_level=0"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
