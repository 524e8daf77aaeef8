"""Linformer (Wang et al. 2020): softmax(X W_Q ((E1 X) W_K)ᵀ / √d_h) (E2 X) W_V.

Product order (per layer; heads share E unless ``sharing="none"``):
  1. Q = X W_Q                                 [N, d_m] · [d_m, d_m]
  2. X1 = E1·(mask⊙X), X2 = E2·(mask⊙X)        [d_k, N] · [N, d_m]  (once if sharing="kv")
  3. K' = X1 W_K, V' = X2 W_V                  [d_k, d_m] · [d_m, d_m]
  4. S = Q K'ᵀ / √d_h                          [N, d_h] · [d_h, d_k]   (per head)
  5. softmax(S) V'                             [N, d_k] · [d_k, d_h]   (per head)
  6. out = concat_heads · W_O                  [N, d_m] · [d_m, d_m]

Padding: padded rows of X are zeroed before E (fairseq ignores the mask; we must not), so padded
content never reaches real outputs. The compressed rows are mixtures, not tokens, so the softmax
runs over all d_k of them. See :mod:`flurka.attention.lowrank` for E's init, slicing and sharing.
"""

from __future__ import annotations

from flurka.attention.full import FullAttention
from flurka.attention.lowrank import LowRankKV


class LinformerAttention(LowRankKV, FullAttention):
    """Low-rank attention; with E1 = E2 = I (d_k = N) it is exactly ``full``."""

    mechanism = "linformer"
