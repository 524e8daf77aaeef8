"""Fused Pallas kernels: the same maths as the attention layers' and the encoder block's XLA
path, written so that GPU speed work reads and writes each large tensor once. They are an
execution choice (``fused=``, ``fused_projections=``, ``fused_ffn=``), never the definition of a
mechanism: the XLA path in :mod:`flurka.attention` and :mod:`flurka.models` is the reference every
kernel is tested against, forward and gradient.

One module per kernel family, named by what it computes rather than by the option that turns it on:

* :mod:`flurka.kernels.query_side`: a kernel mechanism's N-sized query side (φ(q)·KV over
  φ(q)·Σφ(K)) and the EVAs' chunk softmax, plus the tiling and Pallas helpers the others share;
* :mod:`flurka.kernels.compress`: the low-rank compression E·x̂ with the block's LayerNorm
  applied as x is loaded (``PreNorm``, row statistics);
* :mod:`flurka.kernels.projected_layer`: the query side with W_Q and W_O inside it, and the layer
  mixin (``ProjectedQuerySide``) through which an encoder block hands a layer its LayerNorm;
* :mod:`flurka.kernels.ffn`: the block's residual + LayerNorm + FFN.

Dependency direction: the kernels import only the shared pieces of :mod:`flurka.attention`
(``base``, ``feature_maps``); the layer classes and the encoder block import the kernels;
:mod:`flurka.speed` tunes them. Importing ``flurka.attention.base`` runs the attention package
first, whose layers import these kernels: so this package loads it before any kernel module, and
a kernel module imported first (a tuning script, a compile-only check) finds it complete.
"""

import flurka.attention  # noqa: F401  (see above: the layers' package before the kernels)
