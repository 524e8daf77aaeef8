"""Flash comparison training-step plans at N=52.5k (6 layers, bf16): the whole fused layer with
its gradient kernels (FFN, compression), the one-kernel FFN, the step's carried bf16 compute copy.
Usage: PYTHONPATH=.cuda-aot:workers python plans.py h100|h200 OUT.json"""
import sys
from flurka.speed import aot
from flurka.speed.configs import points
from flurka.models.fused_ffn import ONE_KERNEL, use_ffn_tiling
target, out = sys.argv[1], sys.argv[2]
card, device = aot.open_target(aot.TARGETS[target])
doc = aot.document(card, settings={
    "ffn_tiling": f"one-kernel FFN ({ONE_KERNEL})",
    "selection": "flash-compare train N=52500, fused + fused_projections, pad_to 128, fused_ffn; "
                 "gradient kernels for the FFN block and the normalised compression"})
pts = [p for p in points("flash-compare", fused=True, fused_projections=True, fused_ffn=True,
                         pad_to=128)
       if p.seq_len == 52500 and p.mode == "train" and p.mechanism.startswith("flurka-")]
with use_ffn_tiling(ONE_KERNEL):
    aot.compile_points(doc, [({}, p) for p in pts], device, out)
