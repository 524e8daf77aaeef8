"""The layers whose query side the fused kernels can take with W_Q and W_O (performer, rnn and
their FLuRKA variants): the ``fused_projections`` option, and :meth:`ProjectedQuerySide.fused_block`,
the entry through which an encoder block hands such a layer its pre-attention LayerNorm. The
kernels themselves (:mod:`flurka.kernels.projected_layer`, :mod:`flurka.kernels.compress`) come
through :mod:`flurka.attention.execution`'s registry.
"""

from __future__ import annotations

import jax.numpy as jnp

from flurka.attention.base import zero_padding
from flurka.attention.execution import kernel


class ProjectedQuerySide:
    """Mixin for the layers whose query side the kernel takes (performer, rnn and their FLuRKA
    variants): their ``fused_projections`` option, and :meth:`fused_block`, the entry through
    which an encoder block hands such a layer its pre-attention LayerNorm. The layer gives
    ``feature`` ("favor" or "elu"), ``fused`` (its :class:`~flurka.kernels.query_side.Tiling`)
    and ``kernel_key_side(k, v, key_mask, rng) -> (KV, Σφ(K), ω or None)``, which
    :meth:`projected_key_side` applies to :meth:`keys_values`."""

    def init_projections(self, fused_projections: bool, num_features: int | None = None):
        if fused_projections:
            if not self.fused:
                raise ValueError(f"{self.mechanism}: fused_projections needs fused=True")
            kernel("check_projectable", "fused_projections=True")(
                self.mechanism, self.d_model, self.head_dim, num_features, self.align)
            # the fused compression's launch (low-rank layers that fuse the LayerNorm), as set
            # at construction (use_compress_tiling)
            self.compress_tiling = kernel("current_compress_tiling", "fused_projections=True")()
        self.fused_projections = bool(fused_projections)

    def __call__(self, x, mask=None, *, rng=None):
        """The layer's call (:class:`~flurka.attention.base.AttentionLayer`); with
        ``fused_projections`` through :meth:`fused_layer`."""
        if not self.fused_projections:
            return super().__call__(x, mask, rng=rng)
        self.check_inputs(x, mask)
        return self.fused_layer(x, mask, rng)

    def fused_block(self, x, mask=None, *, norm=None, rng=None, statistics=None,
                    residual: bool = False):
        """The layer's output on LN(x), ``norm`` (the block's pre-attention LayerNorm) handed
        over un-applied: run inside the kernels where the layer fuses it (``fuses_norm``: the
        low-rank layers with ``fused_projections`` and one E per layer), else applied first —
        the same function as ``layer(norm(x), mask)``. ``statistics``: x's row statistics for
        it (mean, 1/σ), where the kernel that wrote x computed them, or None. ``residual``
        (layers that fuse the LayerNorm, given it): x + the output in x's dtype, written by
        the kernel that writes the output (the block's residual sum, as the fused FFN block
        would form it: that block then reads one operand, not two)."""
        self.check_inputs(x, mask)
        if residual and (norm is None or not self.fuses_norm):
            raise ValueError(f"{self.mechanism}: residual=True is for layers that fuse the "
                             "block's LayerNorm (fused_projections, one E per layer), given it "
                             "as norm")
        if not self.fuses_norm:
            return self(x if norm is None else norm(x), mask, rng=rng)
        return self.fused_layer(x, mask, rng, norm, statistics, residual)

    def projected_key_side(self, x, mask, rng, norm=None):
        """The kernel's ``side`` operands from the layer's input: x̂ (padded rows zeroed), or
        with ``norm`` (a :class:`~flurka.kernels.compress.PreNorm`) the block's x."""
        if norm is None:
            k, v, key_mask = self.keys_values(x, mask)
        else:
            k, v = self.normalised_kv(x, norm)
            key_mask = self.compressed_mask(x.shape[0], mask, x.shape[1])
        return self.kernel_key_side(k, v, key_mask, rng)

    def normalised_kv(self, x, norm):
        """A low-rank layer's (K', V') from the block's input x through one kernel that
        normalises x as it loads it (``norm`` a :class:`~flurka.kernels.compress.PreNorm`), E
        as stored: x̂ never reaches memory."""
        e2 = self.seq_proj.e2
        x1, x2 = kernel("normalised_compression", "fused_projections=True")(
            x, norm.keep, norm.scale, norm.bias, self.seq_proj.e1[...],
            None if e2 is None else e2[...], eps=norm.eps, stats=(norm.mean, norm.rstd),
            tiling=self.compress_tiling)
        return self.heads(self.key, x1), self.heads(self.value, x2)

    def fused_layer(self, x, mask, rng, norm=None, statistics=None, residual=False):
        """The layer's output through :func:`fused_projected_query_side`; padded rows zeroed
        first (the low-rank path's order: their outputs are nobody's). ``norm`` (an
        ``nnx.LayerNorm``, where the layer ``fuses_norm``): x is the block's input, and the
        LayerNorm runs inside the kernels; the output's dtype is then the LayerNorm's, as if it
        had run first. ``statistics``: x's for it, if the kernel that wrote x computed them
        (taken where the kernels read x in that dtype). ``residual`` (with ``norm``): x + the
        output in x's dtype, added by the kernel where it reads x in that dtype."""
        stream = x
        if norm is None:
            out_dtype = x.dtype
            x = zero_padding(x, mask).astype(self.dtype or x.dtype)
        else:
            pre_norm = kernel("PreNorm", "fused_projections=True")
            out_dtype = pre_norm.output_dtype(norm, x)
            read = x.astype(self.dtype or out_dtype)
            statistics = statistics if read.dtype == x.dtype else None
            x = read
            norm = pre_norm.of(norm, x, mask, statistics=statistics)
        in_kernel = residual and x.dtype == stream.dtype

        def bias(proj):
            return jnp.zeros(self.d_model, x.dtype) if proj.bias is None else proj.bias[...]

        out = kernel("fused_projected_query_side", "fused_projections=True")(
            x, self.query.kernel[...], bias(self.query), self.out.kernel[...], bias(self.out),
            self.projected_key_side(x, mask, rng, norm), feature=self.feature,
            head_dim=self.head_dim, num_features=getattr(self, "num_features", None),
            norm=norm, residual=in_kernel)
        if in_kernel:
            return out
        out = out.astype(out_dtype)
        return stream + out.astype(stream.dtype) if residual else out
