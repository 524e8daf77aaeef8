"""Pre-train then fine-tune: a run that starts from another run's embedding and encoder.

``TrainConfig.init_from`` names a finished run's work dir (``flurka train --init-from DIR``; an
MLflow ``runs:/…/model`` URI is downloaded to one first, :mod:`flurka.training.cli`; a sweep file's
``pretrain:`` section, :mod:`flurka.sweeps.spec`). Its latest checkpoint's *trunk* — every
parameter under ``embedding/`` and ``encoder/`` — replaces the new model's; the task head (the MLM
output layer there, a classifier here) stays freshly drawn, and the optimizer starts afresh, as
BERT-style fine-tuning does. Non-trainable variables (FAVOR+'s ω, EVA's ε) are the new run's own.

Shapes must agree, but for two cuts to a shorter sequence (pre-trained at N = 512, fine-tuned at
n = 128), each the same function as the pre-trained trunk on the input zero-padded to N with the
padding masked, on the first n positions:

* a learned position table gives its first n rows (position t's row, whatever N);
* Linformer's E1/E2 (``linformer``, ``flurka-performer``, ``flurka-rnn``) give their first n
  columns: the layer zeroes padded rows of X before E·X, so E[:, n:]·0 adds nothing and
  E·(mask⊙X) = E[:, :n]·X[:n]; a compressed row is masked where its E row weighs no real position,
  which the padded positions past n never are. So the compressed keys, values and key mask are the
  pre-trained ones, given the padding mask (the classifier and the MLM encoder always pass theirs).
  The compressed length d_k (E's rows) must be the pre-trained one: slicing cuts positions, not
  rows, so a d_k set in proportion to N (GLUE's 64 of 128 against MLM's 256 of 512) is refused.

``flurka-eva`` is refused: its windows and chunks are rows of E in proportion to E's length
(query t at row ⌊t·d_k/N⌋, w' = window·d_k/N), so at n they are other rows and another function:
fine-tune it at the pre-training's length. Anything else that differs — depth, width, another
mechanism's parameters — is refused in one line before any step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flurka.training.checkpoints import run_checkpoint
from flurka.training.state import by_path

TRUNK = ("embedding/", "encoder/")     # what pre-training hands on; the rest is the task's own
POSITIONS = "embedding/position"       # learned positions: a longer pre-trained table is cut
NEW_IN_PAIRS = ("embedding/segment",)  # sentence-pair segment embeddings a pre-trained MLM lacks
SEQ_PROJ = ("/seq_proj/e1", "/seq_proj/e2")   # Linformer's E [(H,) d_k, N]: a longer one is cut
WINDOWED = "/adaptive_mu_"             # beside seq_proj: a LENGTH_BOUND layer (flurka.catalogue), not cut


def load_trunk(workdir: str) -> tuple[dict[str, np.ndarray], int, dict]:
    """(trunk parameters by path, step, metadata) of ``workdir``'s latest checkpoint."""
    with run_checkpoint(workdir) as (ckpt, step):
        state, meta = ckpt.restore_saved(step)
    params = by_path(state["params"])
    return {k: np.asarray(v) for k, v in params.items() if k.startswith(TRUNK)}, step, meta


def cut(key: str, value: np.ndarray, want: tuple[int, ...], trunk: dict[str, Any], source: str) -> np.ndarray:
    """``value`` (the pre-trained ``key``) cut to this run's shorter sequence where that is the
    same function (module docstring), else unchanged; ValueError in one line where E's cut is not."""
    if key == POSITIONS and value.ndim == 2 and value.shape[0] > want[0] and value.shape[1:] == want[1:]:
        return value[:want[0]]
    if not key.endswith(SEQ_PROJ) or value.ndim != len(want) or value.shape[-1] <= want[-1]:
        return value
    if value.shape[:-1] != want[:-1]:
        raise ValueError(f"--init-from {source}: {key} compresses to {value.shape[-2]} rows (d_k) there but "
                         f"{want[-2]} here; cutting E to this run's length keeps its positions, not its rows: "
                         f"fine-tune with d_k={value.shape[-2]}, or pre-train with d_k={want[-2]}")
    layer = key.rsplit("/seq_proj/", 1)[0]
    if any(k.startswith(layer + WINDOWED) for k in trunk):
        raise ValueError(f"--init-from {source}: {key} is flurka-eva's E over {value.shape[-1]} positions, whose "
                         f"windows and chunks are rows in proportion to that length, so cut to {want[-1]} it is "
                         f"another layer; fine-tune flurka-eva at the pre-training's length {value.shape[-1]}")
    return value[..., :want[-1]]


def with_trunk(params: dict[str, Any], trunk: dict[str, np.ndarray], source: str) -> tuple[dict[str, Any], list[str]]:
    """``params`` with ``trunk``'s values under the trunk's paths (:func:`cut` to a shorter
    sequence), and the trunk paths left new (segment embeddings). ValueError in one line naming
    the first disagreement."""
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
        want = tuple(np.shape(params[k]))
        value = cut(k, trunk[k], want, trunk, source)
        if tuple(value.shape) != want:
            raise ValueError(f"--init-from {source}: {k} is {tuple(value.shape)} there but {want} here; "
                             "pre-train with this run's sizes (d_model, d_ff, vocabulary, d_k)")
        out[k] = np.asarray(value, dtype=np.asarray(params[k]).dtype)
    return out, new
