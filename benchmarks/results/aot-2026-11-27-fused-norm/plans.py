"""Flash comparison forward plans at N=52.5k: the whole fused layer (projections with the
pre-attention LayerNorm fused, FFN in one or two kernels)."""
import sys
from flurka.speed import aot
from flurka.speed.configs import points
from flurka.models.fused_ffn import ONE_KERNEL, FfnTiling, use_ffn_tiling
target, form, out = sys.argv[1], sys.argv[2], sys.argv[3]
tiling = ONE_KERNEL if form == "one" else FfnTiling()
card, device = aot.open_target(aot.TARGETS[target])
doc = aot.document(card, settings={
    "ffn_tiling": f"{form}-kernel FFN ({tiling})",
    "selection": "flash-compare forward N=52500, fused + fused_projections (the pre-attention "
                 "LayerNorm inside the compression and the projected query side), pad_to 128, "
                 "fused_ffn"})
pts = [p for p in points("flash-compare", fused=True, fused_projections=True, fused_ffn=True,
                         pad_to=128)
       if p.seq_len == 52500 and p.mode == "forward" and p.mechanism.startswith("flurka-")]
with use_ffn_tiling(tiling):
    aot.compile_points(doc, [({}, p) for p in pts], device, out)
