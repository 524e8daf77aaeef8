"""The results database: normalized sweeps, trials, metrics, speed and theory measurements.

SQLite by default, PostgreSQL by URL. Producers call ``open_results(url)`` (fails at once, one
line, if the database is unreachable) and ``ingest_sweep`` / ``ingest_speed`` / ``ingest_theory``; the paper's tables
are pandas functions in ``flurka.results.quality_tables`` and ``flurka.results.speed_tables``
(imported separately: they pull in pandas).
"""

from flurka.results.db import (DEFAULT_URL, DatabaseUnreachable, SchemaOutOfDate, connect, open_results, redact,
                                upgrade)
from flurka.results.ingest import IngestReport, ingest_file, ingest_speed, ingest_sweep, ingest_theory
from flurka.results.records import (BENCHMARKS, MECHANISMS, EnvironmentRecord, SpeedRecord, SweepRecord, TheoryRecord,
                                     TrialRecord, trial_from_result)

__all__ = [
    "BENCHMARKS", "DEFAULT_URL", "MECHANISMS", "DatabaseUnreachable", "EnvironmentRecord", "IngestReport",
    "SchemaOutOfDate", "SpeedRecord", "SweepRecord", "TheoryRecord", "TrialRecord", "connect", "ingest_file",
    "ingest_speed", "ingest_sweep", "ingest_theory", "open_results", "redact", "trial_from_result", "upgrade",
]
