"""The results database: normalized sweeps, trials, metrics and speed measurements.

SQLite by default, PostgreSQL by URL. Producers call ``open_results(url)`` (fails at once, one
line, if the database is unreachable) and ``ingest_sweep`` / ``ingest_speed``; the paper's tables
are pandas functions in ``flurka.results.tables`` (imported separately: it pulls in pandas).
"""

from flurka.results.db import (DEFAULT_URL, DatabaseUnreachable, SchemaOutOfDate, connect, open_results, redact,
                                upgrade)
from flurka.results.ingest import IngestReport, ingest_file, ingest_speed, ingest_sweep
from flurka.results.records import (BENCHMARKS, MECHANISMS, EnvironmentRecord, SpeedRecord, SweepRecord, TrialRecord,
                                     trial_from_result)

__all__ = [
    "BENCHMARKS", "DEFAULT_URL", "MECHANISMS", "DatabaseUnreachable", "EnvironmentRecord", "IngestReport",
    "SchemaOutOfDate", "SpeedRecord", "SweepRecord", "TrialRecord", "connect", "ingest_file", "ingest_speed",
    "ingest_sweep", "open_results", "redact", "trial_from_result", "upgrade",
]
