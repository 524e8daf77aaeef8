"""Performer / FAVOR+ (Choromanski et al. 2021), bidirectional.

φ(x) = m^-1/2 (exp(ωᵀx' − |x'|²/2 − stabilizer) + 1e-6), x' = d_h^-1/4 x, ω ∈ R^{m×d_h} positive
orthogonal random features (shared by heads), as in google-research
``performer/fast_attention/jax/fast_attention.py``; denominator R + 2e-6·[|R| ≤ 1e-6].

Product order (per head; m = num_features):
  1. Q, K, V = X W_Q, X W_K, X W_V             3 × [N, d_m] · [d_m, d_m]
  2. Q'ω, K'ω                                 2 × [N, d_h] · [d_h, m]  (+ exp)
  3. φ(K)ᵀ V                                   [m, N] · [N, d_h]
  4. φ(Q) · (φ(K)ᵀV)                           [N, m] · [m, d_h]
  5. denominator φ(Q)·(φ(K)ᵀ1)                 [N, m] · [m]
  6. out = concat_heads · W_O

Features: ``redraw=False`` keeps ω drawn at construction (a :class:`RandomFeatures` variable,
not a Param, so optimizers skip it); ``redraw=True`` draws ω from the ``rng`` passed at call
(``layer(x, mask, rng=key)``; missing ``rng`` is an error). Padding: masked keys and values are
zeroed and masked out of the key stabilizer, so their features are exact zeros.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from flurka.attention.base import (
    AttentionLayer, RandomFeatures, check_positive_int, pad_to, round_up, zero_padding)
from flurka.attention.feature_maps import (
    favor_denominator, favor_features, gaussian_orthogonal_matrix, key_side, query_side)
from flurka.attention.execution import kernel, layer_tiling
from flurka.attention.projected import ProjectedQuerySide

DEFAULT_NUM_FEATURES = 256  # google-research default nb_features


def favor_key_side(k, v, key_mask, omega, *, head_dim=None, num_features=None):
    """(φ(K)ᵀV, φ(K)ᵀ1) with FAVOR+'s key features, masked keys and values exact zeros."""
    k, v = zero_padding(k, key_mask), zero_padding(v, key_mask)
    return key_side(favor_features(k, omega, is_query=False, mask=key_mask, head_dim=head_dim,
                                   num_features=num_features), v)


def favor_attention(q, k, v, key_mask, omega, *, head_dim=None, num_features=None, fused=False):
    """FAVOR+ on projected heads; float32 [b, n, h, d_h] (fused: in v's dtype, what W_O takes).
    ``head_dim``/``num_features``: the true
    sizes when the head dim and ω are zero-padded (aligned layers); ``fused`` (a
    :class:`~flurka.kernels.query_side.Tiling`, or True for the current one): the query side as one
    Pallas kernel (:mod:`flurka.kernels.query_side`)."""
    sizes = dict(head_dim=head_dim, num_features=num_features)
    kv, k_sum = favor_key_side(k, v, key_mask, omega, **sizes)
    if fused:
        return kernel("fused_query_side", "fused=True")(q, kv, k_sum, omega, feature="favor",
                                                       head_dim=head_dim or q.shape[-1],
                                                       num_features=num_features or omega.shape[0],
                                                       tiling=fused, out_dtype=v.dtype)
    return query_side(q, functools.partial(favor_features, omega=omega, is_query=True, **sizes),
                      kv, k_sum, favor_denominator, v.dtype)


class RandomFeatureMixin:
    """Fixed-or-redrawn random draws through an explicit key (performer, EVA and their FLuRKA
    variants)."""

    redraw: bool = False

    def check_rng(self, rng):
        if rng is None:
            raise ValueError(f"{self.mechanism}: redraw=True needs an explicit key: "
                             f"layer(x, mask, rng=jax.random.key(...))")
        return rng


class PerformerAttention(RandomFeatureMixin, ProjectedQuerySide, AttentionLayer):
    """FAVOR+ kernel attention with ``num_features`` positive orthogonal random features.
    ``fused``: the query side as a Pallas kernel; ``fused_projections`` too: with W_Q and W_O in
    it (:mod:`flurka.kernels.projected_layer`)."""

    mechanism = "performer"
    feature = "favor"

    def __init__(self, *, num_features: int = DEFAULT_NUM_FEATURES, orthogonal: bool = True,
                 redraw: bool = False, fused: Any = False,
                 fused_projections: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.num_features = check_positive_int("num_features", num_features)
        self.orthogonal = bool(orthogonal)
        self.redraw = bool(redraw)
        self.fused = layer_tiling(self.mechanism, fused, self.padded_head_dim,
                                  round_up(self.num_features, self.align))
        self.features = RandomFeatures(self.draw_features(kwargs["rngs"].params()))
        self.init_projections(fused_projections, self.num_features)

    def draw_features(self, key: jax.Array) -> jax.Array:
        """ω [num_features, d_h] float32 from ``key``."""
        return gaussian_orthogonal_matrix(key, self.num_features, self.head_dim,
                                          orthogonal=self.orthogonal)

    def omega(self, rng):
        """ω [m, d_h]; aligned layers: zero-padded to [round_up(m), padded d_h]."""
        omega = self.draw_features(self.check_rng(rng)) if self.redraw else self.features[...]
        if self.align:
            omega = pad_to(pad_to(omega, round_up(self.num_features, self.align), axis=0),
                           self.padded_head_dim, axis=1)
        return omega

    def kernel_key_side(self, k, v, key_mask, rng):
        omega = self.omega(rng)
        return (*favor_key_side(k, v, key_mask, omega, head_dim=self.head_dim,
                                num_features=self.num_features), omega)

    def core(self, q, k, v, key_mask, rng):
        return favor_attention(q, k, v, key_mask, self.omega(rng), head_dim=self.head_dim,
                               num_features=self.num_features, fused=self.fused)
