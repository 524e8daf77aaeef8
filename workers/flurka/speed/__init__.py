"""Step-time measurement of every attention mechanism (paper §4.1, §4.3.1, appendix C).

Runs with JAX alone (``python -m flurka.speed``; no Ray, MLflow or SQL here). Parts:
``configs`` (the sweeps as data), ``timing`` (medians over samples of back-to-back calls, OOM as a result),
``ceilings`` (measured matmul rate / copy bandwidth and the floor of a point), ``bench`` (build,
compile and time one point), ``runner`` (a list of points → one JSON document), ``profile``
(where a step's device time goes), ``tuning`` (the fused kernels'
launch shape) and ``aot`` (compiling points and kernels for a GPU that is not here: memory,
traffic, registers and spills). ``experiments/speed_sweep.py`` runs the same points as Ray tasks.
"""
