"""Pre-train then fine-tune: a run that starts from another run's embedding and encoder.

``TrainConfig.init_from`` names a finished run's work dir (``flurka train --init-from DIR``; an
MLflow ``runs:/…/model`` URI is downloaded to one first, :mod:`flurka.training.cli`). Its latest
checkpoint's *trunk* — every parameter under ``embedding/`` and ``encoder/`` — replaces the new
model's; the task head (the MLM output layer there, a classifier here) stays freshly drawn, and the
optimizer starts afresh, as BERT-style fine-tuning does. One exception to "shapes must agree": a
learned position table pre-trained longer than this run's sequence gives its first rows (a
model pre-trained at 512 fine-tuned at 128). Anything else that differs — depth, width, another
mechanism's parameters, a compressed length E1/E2 tied to another N — is refused in one line
before any step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flurka.training.checkpoints import run_checkpoint
from flurka.training.state import by_path

TRUNK = ("embedding/", "encoder/")     # what pre-training hands on; the rest is the task's own
POSITIONS = "embedding/position"       # learned positions: a longer pre-trained table is cut
NEW_IN_PAIRS = ("embedding/segment",)  # sentence-pair segment embeddings a pre-trained MLM lacks


def load_trunk(workdir: str) -> tuple[dict[str, np.ndarray], int, dict]:
    """(trunk parameters by path, step, metadata) of ``workdir``'s latest checkpoint."""
    with run_checkpoint(workdir) as (ckpt, step):
        state, meta = ckpt.restore_saved(step)
    params = by_path(state["params"])
    return {k: np.asarray(v) for k, v in params.items() if k.startswith(TRUNK)}, step, meta


def with_trunk(params: dict[str, Any], trunk: dict[str, np.ndarray], source: str) -> tuple[dict[str, Any], list[str]]:
    """``params`` with ``trunk``'s values under the trunk's paths, and the trunk paths left new
    (segment embeddings). ValueError in one line naming the first disagreement."""
    ours = sorted(k for k in params if k.startswith(TRUNK))
    new = [k for k in ours if k not in trunk and k.startswith(NEW_IN_PAIRS)]
    lacking = [k for k in ours if k not in trunk and k not in new]
    extra = sorted(set(trunk) - set(ours))
    if lacking or extra:
        what = (f"has no {lacking[0]}" if lacking else f"has {extra[0]}, which this model lacks")
        count = len(lacking) + len(extra)
        raise ValueError(f"--init-from {source}: its encoder is another architecture: it {what}"
                         + (f" (and {count - 1} more differences)" if count > 1 else "")
                         + "; pre-train with this run's mechanism, depth and width")
    out = dict(params)
    for k in ours:
        if k in new:
            continue
        value, want = trunk[k], tuple(np.shape(params[k]))
        if k == POSITIONS and value.ndim == 2 and value.shape[0] > want[0] and value.shape[1:] == want[1:]:
            value = value[:want[0]]
        if tuple(value.shape) != want:
            raise ValueError(f"--init-from {source}: {k} is {tuple(value.shape)} there but {want} here; "
                             "pre-train with this run's sizes (d_model, d_ff, vocabulary, d_k at this length)")
        out[k] = np.asarray(value, dtype=np.asarray(params[k]).dtype)
    return out, new
