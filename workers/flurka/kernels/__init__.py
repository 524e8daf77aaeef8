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
* :mod:`flurka.kernels.projected_layer`: the query side with W_Q and W_O inside it (the layers'
  side of it, through which an encoder block hands a layer its LayerNorm, is
  :mod:`flurka.attention.projected`);
* :mod:`flurka.kernels.joint_softmax`: EVA's joint softmax with its chunk half in the softmax kernel;
* :mod:`flurka.kernels.ffn`: the block's residual + LayerNorm + FFN.

Dependency direction: the kernels import :mod:`flurka.attention` (its shared pieces, and EVA's XLA
joint softmax, the reference of :mod:`flurka.kernels.joint_softmax`); nothing in
:mod:`flurka.attention` or :mod:`flurka.models` imports them. Importing this package registers
each entry point the layers' options call (``fused``, ``fused_projections``, ``fused_ffn``) in
:mod:`flurka.attention.execution`; :mod:`flurka.speed`, the harness that runs them, imports it.
"""

from flurka.attention import execution
from flurka.kernels.compress import PreNorm, current_compress_tiling, normalised_compression
from flurka.kernels.ffn import fused_ffn_block, ffn_tiling
from flurka.kernels.joint_softmax import fused_joint_softmax
from flurka.kernels.projected_layer import check_projectable, fused_projected_query_side
from flurka.kernels.query_side import fused_query_side, layer_tiling

execution.register(
    fused_query_side=fused_query_side, layer_tiling=layer_tiling,            # fused (kernel layers)
    fused_joint_softmax=fused_joint_softmax,                                 # fused (eva, flurka-eva)
    check_projectable=check_projectable, fused_projected_query_side=fused_projected_query_side,
    PreNorm=PreNorm, current_compress_tiling=current_compress_tiling,        # fused_projections
    normalised_compression=normalised_compression,
    ffn_tiling=ffn_tiling, fused_ffn_block=fused_ffn_block,                  # fused_ffn
)
