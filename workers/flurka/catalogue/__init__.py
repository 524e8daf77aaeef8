"""The catalogue: each fact about a mechanism or a metric declared once, in plain Python (no JAX),
so that configs, sweeps, records, tables, reports and the layers' factory read the same entry.

* :mod:`flurka.catalogue.mechanisms`: each attention mechanism, its family, its layer and the
  settings it reads; the FLuRKA variants' constituents; the no-attention control.
* :mod:`flurka.catalogue.metrics`: each recorded metric, its direction, whether it is a fraction
  (shown in percent), its chance line, unit and decimals.

Benchmarks are configs as code: each registers in :mod:`flurka.configs` with the paper table and
columns it fills, so a benchmark, too, is declared once.
"""
