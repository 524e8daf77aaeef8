"""MLflow tracking of sweeps: one parent run per sweep, one nested run per trial, the paper's
tables on the parent. All writes come from the sweep's driver (:class:`SweepTracker`); the Tune
side is :mod:`flurka.tracking.callback` (imports Ray). The names the MLflow UI shows (runs,
metrics, table columns) are made in :mod:`flurka.tracking.mlflow_runs`."""

from flurka.tracking.mlflow_runs import (SweepTracker, artifact_root_for, flatten, git_commit, metric_name,
                                         package_versions, table_column, trial_run_name)

__all__ = ["SweepTracker", "artifact_root_for", "flatten", "git_commit", "metric_name", "package_versions",
           "table_column", "trial_run_name"]
