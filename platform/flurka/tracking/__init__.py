"""MLflow tracking of sweeps: one parent run per sweep, one nested run per trial, the paper's
tables on the parent. All writes come from the sweep's driver (:class:`SweepTracker`); the Tune
side is :mod:`flurka.tracking.callback` (imports Ray)."""

from flurka.tracking.mlflow_runs import SweepTracker, artifact_root_for, flatten, git_commit, package_versions

__all__ = ["SweepTracker", "artifact_root_for", "flatten", "git_commit", "package_versions"]
