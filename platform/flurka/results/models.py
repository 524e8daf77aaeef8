"""The results schema: SQLAlchemy 2 declarative models.

Every table has a natural unique key (sweep external id; trial per sweep; metric per trial;
curve point per trial, metric and step; speed measurement per configuration hash; theory run per
hash of its document's time, device and config; environment per fingerprint) so that ingesting the
same record twice adds nothing. The schema is created
only by the Alembic migrations next to this module; a test checks both agree.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, MetaData, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Deterministic constraint names, identical on SQLite and PostgreSQL, so migrations can name them.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, dt.datetime: DateTime(timezone=True)}


class Environment(Base):
    """Where something ran: device, host and package versions."""

    __tablename__ = "environments"
    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    device: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    versions: Mapped[dict[str, Any]]


class Sweep(Base):
    __tablename__ = "sweeps"
    id: Mapped[int] = mapped_column(primary_key=True)
    external_id: Mapped[str] = mapped_column(String(255), unique=True)
    name: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[dt.datetime]
    git_commit: Mapped[str | None] = mapped_column(String(64))
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), index=True)

    environment: Mapped[Environment] = relationship()
    trials: Mapped[list[Trial]] = relationship(back_populates="sweep", cascade="all, delete-orphan")


class Trial(Base):
    """One training run: a mechanism on a benchmark with its hyperparameters and outcome."""

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("sweep_id", "trial_key"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    trial_key: Mapped[str] = mapped_column(String(255))
    attention: Mapped[str] = mapped_column(String(32), index=True)
    benchmark: Mapped[str] = mapped_column(String(64), index=True)
    seed: Mapped[int]
    status: Mapped[str] = mapped_column(String(255))
    steps: Mapped[int]
    alpha: Mapped[float | None] = mapped_column(Float)
    base: Mapped[str | None] = mapped_column(String(32))
    d_k: Mapped[int | None] = mapped_column(Integer)
    num_features: Mapped[int | None] = mapped_column(Integer)
    train_flops: Mapped[float | None] = mapped_column(Float)
    wall_time_s: Mapped[float | None] = mapped_column(Float)
    config: Mapped[dict[str, Any] | None]
    # Where the trial itself ran (revision 0005; None where unknown: no result, or stored before):
    # its node's hostname, JAX's device kind ("cpu", "NVIDIA H100 80GB HBM3") and count, and its
    # peak memory in bytes: the process's resident set, the most one device's allocator held.
    node: Mapped[str | None] = mapped_column(String(255))
    device: Mapped[str | None] = mapped_column(String(255))
    device_count: Mapped[int | None] = mapped_column(Integer)
    peak_host_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_device_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # Lineage (revision 0006): the trial key (a sweep's) or work dir of the run it was fine-tuned from.
    init_from: Mapped[str | None] = mapped_column(String(1024))

    sweep: Mapped[Sweep] = relationship(back_populates="trials")
    metrics: Mapped[list[Metric]] = relationship(cascade="all, delete-orphan")
    curve: Mapped[list[CurvePoint]] = relationship(cascade="all, delete-orphan")


class Metric(Base):
    """A final metric of a trial (accuracy, bleu, perplexity, ...)."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("trial_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)


class CurvePoint(Base):
    """One value of a training curve (loss, cumulative train_flops, ...) at a step."""

    __tablename__ = "curve_points"
    __table_args__ = (UniqueConstraint("trial_id", "name", "step"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    step: Mapped[int]
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)


class SpeedMeasurement(Base):
    """One step-time measurement (or an out-of-memory) of a mechanism at one configuration."""

    __tablename__ = "speed_measurements"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), index=True)
    mechanism: Mapped[str] = mapped_column(String(32), index=True)
    mode: Mapped[str] = mapped_column(String(16))
    scope: Mapped[str | None] = mapped_column(String(16))
    seq_len: Mapped[int]
    d_model: Mapped[int]
    heads: Mapped[int]
    d_k: Mapped[int | None] = mapped_column(Integer)
    num_features: Mapped[int | None] = mapped_column(Integer)
    batch: Mapped[int]
    dtype: Mapped[str | None] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    median_s: Mapped[float | None] = mapped_column(Float)
    spread_s: Mapped[float | None] = mapped_column(Float)
    flops: Mapped[float | None] = mapped_column(Float)
    config: Mapped[dict[str, Any] | None]
    # Which run timed it (a flurka.speed document's creation time): mechanisms timed in one run
    # share its machine's state, so a ratio of two is taken within a run. Not part of ``key``.
    run: Mapped[str | None] = mapped_column(String(64))

    environment: Mapped[Environment] = relationship()


class TheoryRun(Base):
    """One ``flurka.theory`` document: when, where and with which configuration it measured.

    ``config`` is the document's own (opaque JSON: sizes, seeds, ``inputs``, a captured-input
    ``source``, ...); its rows are the approximation errors and kernel ranks below.
    """

    __tablename__ = "theory_runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), index=True)
    created_at: Mapped[dt.datetime]
    config: Mapped[dict[str, Any]]

    environment: Mapped[Environment] = relationship()
    errors: Mapped[list[ApproximationError]] = relationship(cascade="all, delete-orphan")
    ranks: Mapped[list[KernelRank]] = relationship(cascade="all, delete-orphan")


class ApproximationError(Base):
    """A mechanism's error against full attention with the same projections (Theorem 1), one seed;
    ``layer`` is the trained model's layer whose captured inputs were used (None: random inputs)."""

    __tablename__ = "approximation_errors"
    id: Mapped[int] = mapped_column(primary_key=True)
    theory_run_id: Mapped[int] = mapped_column(ForeignKey("theory_runs.id", ondelete="CASCADE"), index=True)
    mechanism: Mapped[str] = mapped_column(String(32))
    d_k: Mapped[int | None] = mapped_column(Integer)
    m: Mapped[int | None] = mapped_column(Integer)
    seed: Mapped[int]
    layer: Mapped[int | None] = mapped_column(Integer)
    rel_error: Mapped[float] = mapped_column(Float)
    inf_error: Mapped[float] = mapped_column(Float)
    kernel_term: Mapped[float | None] = mapped_column(Float)
    lowrank_term: Mapped[float | None] = mapped_column(Float)


class KernelRank(Base):
    """Numerical rank of φ(Q)φ(K)ᵀ of one head (Fig. 2); ``max_rank`` is the full rank min(N, N_k)."""

    __tablename__ = "kernel_ranks"
    id: Mapped[int] = mapped_column(primary_key=True)
    theory_run_id: Mapped[int] = mapped_column(ForeignKey("theory_runs.id", ondelete="CASCADE"), index=True)
    mechanism: Mapped[str] = mapped_column(String(32))
    seed: Mapped[int | None] = mapped_column(Integer)
    example: Mapped[int | None] = mapped_column(Integer)
    head: Mapped[int]
    layer: Mapped[int | None] = mapped_column(Integer)
    rank: Mapped[int]
    max_rank: Mapped[int]
    d_k: Mapped[int | None] = mapped_column(Integer)
    m: Mapped[int | None] = mapped_column(Integer)
    trained: Mapped[bool | None] = mapped_column(Boolean)  # the trained model's own layer (--from-run)
