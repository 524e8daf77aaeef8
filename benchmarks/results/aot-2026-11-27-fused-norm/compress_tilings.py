"""ptxas's report for the compression tuner's candidates at COMPRESS_SIZE (H100 target)."""
import dataclasses, json, sys, tempfile, jax
from flurka.speed import aot, tuning
from flurka.attention.fused_compress import CompressTiling, normalised_compression, row_statistics
card, device = aot.open_target(aot.TARGETS[sys.argv[1]])
x, keep, scale, bias, e1, e2 = tuning.compress_inputs(**tuning.COMPRESS_SIZE)
rows = []
for t in [CompressTiling(), *(CompressTiling(*g) for g in tuning.COMPRESS_GRID)]:
    def step(x, keep, scale, bias, e1, e2, t=t):
        stats = row_statistics(x, eps=1e-6)
        return normalised_compression(x, keep, scale, bias, e1, e2, eps=1e-6, stats=stats, tiling=t)
    row = {"stage": "compression", "tiling": dataclasses.asdict(t)}
    with tempfile.TemporaryDirectory() as dump:
        try:
            aot.compile_for(jax.jit(step), (x, keep, scale, bias, e1, e2), device, dump)
            row.update(status="ok", kernels=aot.kernel_report(dump))
        except Exception as exc:
            row.update(status="error", error=repr(exc)[:500])
    rows.append(row)
    print(aot.brief(row), flush=True)
doc = aot.document(card, settings={"size": {**tuning.COMPRESS_SIZE, "dtype": "bfloat16"},
                                   "what": "flurka.speed.tuning.COMPRESS_GRID and the default"})
doc["results"] = rows
json.dump(doc, open(sys.argv[2], "w"), indent=1)
