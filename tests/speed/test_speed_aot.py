"""Compiling for an H100 that is not here (``flurka.speed.aot``): XLA's deviceless compile with
JAX's own CUDA compiler (``make test`` installs it under ``.cuda-aot``), in a subprocess, since it
must be importable before JAX starts and this process's JAX has started without it."""

from __future__ import annotations

import dataclasses
import json

import pytest
from testsupport import cuda_compiler_script, run_with_cuda_compiler

from flurka.kernels.query_side import Tiling

H100_MEMORY = 84_929_347_584


_run, _script = run_with_cuda_compiler, cuda_compiler_script


@pytest.mark.slow
def test_fused_kernels_compile_for_an_h100_and_the_default_launch_does_not_spill(tmp_path):
    """The Pallas kernels of the flash comparison's query side (d_h = m = 128, bf16) compiled to
    sm_90a by XLA, with ptxas's report: the default launch and every candidate of the tuner's
    grids compile without spilling, on Hopper's warpgroup MMA, in the card's shared memory (the
    default forward: 8 warps over 128 rows); backward steps of 64 rows spill (why the default
    is 32); a launch past the card's shared memory is a row with XLA's error, not a crash."""
    rows = _script("""
        import json, sys, jax
        jax.config.update("jax_platforms", "cpu")
        from flurka.kernels.query_side import Tiling
        from flurka.speed import aot, tuning
        device, t = aot.target_device(aot.TARGETS["h100"]), Tiling()
        forward = [(t.block_n, t.num_warps), *tuning.FORWARD_GRID]
        backward = [(t.bwd_block_n, t.bwd_rows, t.bwd_num_warps),
                    *((n, r, w) for n, r, w in tuning.BACKWARD_GRID if r == 1024),
                    (64, 1024, None), (256, 1024, None)]
        rows = aot.compile_tilings(device, forward_grid=forward, backward_grid=backward,
                                   wide_grid=((16, 8), (64, 8)), wide_size={"seq_len": 4096},
                                   softmax_grid=((t.softmax_block_n, t.softmax_num_warps,
                                                  t.softmax_num_stages), (16, 4, 2), (64, 8, 2)),
                                   softmax_size={"seq_len": 4096}, seq_len=4096, d_k=256)
        json.dump(rows, open(sys.argv[1], "w"))
    """, tmp_path)
    default = Tiling()
    spills, too_big = (dataclasses.asdict(dataclasses.replace(default, bwd_block_n=n))
                       for n in (64, 256))

    def row(stage, feature, tiling):
        (found,) = [r for r in rows
                    if (r["stage"], r["feature"], r["tiling"]) == (stage, feature, tiling)]
        return found

    for r in rows:   # the default and every candidate the tuner would time on the card
        if r["tiling"] not in (spills, too_big) and r["stage"] not in ("wide", "softmax"):
            assert r["status"] == "ok", r
            for kernel in r["kernels"]:
                assert kernel["spill_store_bytes"] == 0 and kernel["registers"] <= 255, r
                assert 0 < kernel["shared_memory_bytes"] <= 232_448 and kernel["mma"] == "wgmma", r
    for feature in ("favor", "elu"):
        (forward,) = row("forward", feature, dataclasses.asdict(default))["kernels"]
        assert forward["kernel"] == f"flurka_{feature}_query_side"
        assert forward["grid"] == [1, 4, 4096 // 128] and forward["threads"] == 8 * 32
        gradient = row("gradient", feature, dataclasses.asdict(default))
        kernels = {k["kernel"] for k in gradient["kernels"]}
        assert kernels == {f"flurka_{feature}_query_side", f"flurka_{feature}_query_side_bwd"}
        failed = row("gradient", feature, too_big)
        assert failed["status"] == "error" and "hared memory" in failed["error"], failed
    (bwd_64,) = [k for k in row("gradient", "favor", spills)["kernels"]
                 if k["kernel"].endswith("_bwd")]
    assert bwd_64["spill_store_bytes"] > 0
    # The wide forward (the N-sweep's d_h = m = 325 → 384, 8 heads): 16 rows run spill-free on
    # per-warp mma.sync; 64 rows take the warpgroup MMA at a small spill (ptxas: 0–0.3 KB).
    for feature in ("favor", "elu"):
        for rows_, mma, spill in ((16, "mma.sync", 0), (64, "wgmma", 512)):
            (kernel,) = row("wide", feature, dataclasses.asdict(Tiling(wide_block_n=rows_)))["kernels"]
            assert kernel["grid"] == [1, 8, 4096 // rows_] and kernel["threads"] == 8 * 32
            assert kernel["mma"] == mma and kernel["spill_store_bytes"] <= spill, kernel
    # The wide softmax (plain EVA's chunk softmax, d_h 325 → 384): the default 64 rows on wgmma in
    # one stage and 16 rows on mma.sync in two, both spill-free; 64 rows on two stages overflow
    # shared memory (a row with the error).
    for tiling, mma in ((default, "wgmma"), (Tiling(softmax_block_n=16, softmax_num_warps=4,
                                                    softmax_num_stages=2), "mma.sync")):
        (kernel,) = row("softmax", "softmax", dataclasses.asdict(tiling))["kernels"]
        assert kernel["kernel"] == "flurka_softmax_query_side" and kernel["mma"] == mma, kernel
        assert kernel["spill_store_bytes"] == 0 and kernel["shared_memory_bytes"] <= 232_448, kernel
        assert kernel["grid"] == [1, 8, 4096 // tiling.softmax_block_n], kernel
    failed = row("softmax", "softmax", dataclasses.asdict(Tiling(softmax_num_stages=2)))
    assert failed["status"] == "error" and "hared memory" in failed["error"], failed


@pytest.mark.slow
def test_points_compile_for_an_h100_with_the_memory_they_need(tmp_path):
    """N-sweep layers at N = 55.5k, bf16, compiled for the card: full attention's step needs at
    least its [H, N, N] bf16 scores (49 GB; with the float32 softmax more than the card's 79 GiB:
    an "oom" row, unrun); FLuRKA-RNN fits, its arguments at least the input and the bf16
    parameters. The wide fused forward (d_h = m = 325 in 128-wide blocks) compiles to 64-row
    programs on the warpgroup MMA, spilling little."""
    out = tmp_path / "aot.json"
    listing = _run(["-m", "flurka.speed.aot", "--sweep", "n-sweep", "--modes", "forward",
                    "--scope", "layer", "--align", "128", "--fused", "--mechanisms",
                    "full,flurka-rnn", "--list"], with_compiler=False)
    indices = [line.split()[0] for line in listing.stdout.splitlines() if "seq_len=55500" in line]
    assert len(indices) == 2, listing.stdout + listing.stderr
    proc = _run(["-m", "flurka.speed.aot", "--target", "h100", "--sweep", "n-sweep", "--modes",
                 "forward", "--scope", "layer", "--align", "128", "--fused", "--mechanisms",
                 "full,flurka-rnn", "--points", ",".join(indices), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "flurka.aot/1" and doc["target"]["memory_bytes"] == H100_MEMORY
    rows = {r["mechanism"]: r for r in doc["results"]}
    n, d, heads = 55_500, 2600, 8
    full, flurka = rows["full"], rows["flurka-rnn"]
    assert full["memory"]["peak_bytes"] >= heads * n * n * 2
    assert full["status"] == "oom" and full["memory"]["peak_bytes"] > H100_MEMORY
    assert flurka["status"] == "ok" and flurka["memory"]["peak_bytes"] < H100_MEMORY
    assert flurka["memory"]["argument"] >= n * d * 2 + 2 * flurka["params"]
    (kernel,) = flurka["kernels"]
    assert kernel["kernel"] == "flurka_elu_query_side" and kernel["spill_store_bytes"] <= 64
    assert kernel["grid"] == [1, heads, 55_552 // 64] and kernel["mma"] == "wgmma"  # N aligned
    # Its unaligned training step (whose [2600, 2600] weight gradients XLA's default Triton GEMM
    # tiling refuses without the card) compiles too, and fits.
    listing = _run(["-m", "flurka.speed.aot", "--sweep", "n-sweep", "--modes", "train", "--scope",
                    "layer", "--mechanisms", "flurka-rnn", "--list"], with_compiler=False)
    (index,) = [line.split()[0] for line in listing.stdout.splitlines() if "seq_len=55500" in line]
    proc = _run(["-m", "flurka.speed.aot", "--sweep", "n-sweep", "--modes", "train", "--scope",
                 "layer", "--mechanisms", "flurka-rnn", "--points", index, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (train,) = json.loads(out.read_text())["results"]
    assert train["status"] == "ok" and train["memory"]["peak_bytes"] < H100_MEMORY, train


@pytest.mark.parametrize("options", [{}, {"align": 12, "pad_to": 80}, {"fused": True}],
                         ids=["plain", "aligned-padded", "fused"])
def test_points_are_described_from_shapes_as_from_arrays(options):
    """A point compiled for the card is built from shapes alone (its parameters can be gigabytes
    of random numbers): the same parameter counts, sizes, FLOPs, fewest bytes and argument
    shapes as the point built from arrays, in both modes and scopes, and nothing computed."""
    import jax

    from flurka.speed import bench, configs
    pts = configs.points("tiny", mechanisms=["full", "performer", "flurka-rnn", "flurka-eva"],
                         **options)
    assert {(p.mode, p.scope) for p in pts} == {(m, s) for m in ("forward", "train")
                                                for s in ("layer", "model")}
    for point in pts:
        shaped, built = {}, {}
        _, shapes = bench.describe(point, shaped, abstract=True)
        _, arrays = bench.describe(point, built)
        assert shaped == built and shaped["min_bytes"] > 0, point
        assert all(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(shapes))
        assert jax.tree.map(lambda a: (a.shape, a.dtype), shapes) == \
            jax.tree.map(lambda a: (a.shape, a.dtype), arrays), point


def test_without_the_cuda_compiler_the_error_says_how_to_get_it(tmp_path):
    proc = _run(["-m", "flurka.speed.aot", "--sweep", "tiny", "--out", str(tmp_path / "x.json")],
                with_compiler=False)
    assert proc.returncode == 2
    assert "XLA's CUDA compiler" in proc.stderr and "make aot" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_the_lease_plan_compiles_for_the_card_before_the_lease(tmp_path):
    """``gpu_session.py --aot h100``: the plan's points (here the dry run's five) compiled for
    the card in plan order, not timed: the XLA points launch none of our kernels, the fused one
    exactly its query-side kernel, the fused FFN one its two kernels, the whole fused block the
    LayerNorm's statistics, the compression, the projected query side and the FFN's two, all
    spill-free."""
    proc = _run(["benchmarks/gpu_session.py", "--out", str(tmp_path), "--tiny", "--aot", "h100"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "aot.json").read_text())
    assert doc["target"]["name"] == "NVIDIA H100 80GB HBM3" and doc["settings"]["plan"] == "tiny"
    assert [(r["mechanism"], r["fused"], r["fused_ffn"], r["fused_projections"])
            for r in doc["results"]] == \
        [("flurka-rnn", False, False, False), ("rnn", False, False, False),
         ("flurka-rnn", True, False, False), ("flurka-rnn", False, True, False),
         ("flurka-rnn", True, True, True)]
    assert all(r["status"] == "ok" and r["memory"]["peak_bytes"] > 0 for r in doc["results"])
    assert [sorted(k["kernel"] for k in r["kernels"]) for r in doc["results"]] == [
        [], [], ["flurka_elu_query_side"], ["flurka_fc2_residual", "flurka_ln_fc1"],
        ["flurka_elu_projected_query_side", "flurka_fc2_residual", "flurka_ln_fc1",
         "flurka_normalised_compression", "flurka_row_statistics"]]
    assert all(k["spill_store_bytes"] == 0 for r in doc["results"] for k in r["kernels"])
    assert not (tmp_path / "check.json").exists()      # nothing ran on a device


def test_planned_traffic_counts_each_kernels_operands_and_results(tmp_path):
    """A row sum over a [4096, 4096] float32 array compiles for the card to one kernel that
    reads the array once and writes the sums: 64 MiB + 16 KiB, one launch."""
    out = _script("""
        import json, sys, tempfile, jax, jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        from flurka.speed import aot, profile
        device = aot.target_device(aot.TARGETS["h100"])
        x = jax.ShapeDtypeStruct((4096, 4096), jnp.float32)
        with tempfile.TemporaryDirectory() as dump:
            _, compiled = aot.compile_for(jax.jit(lambda x: jnp.sum(2 * x, axis=1)), (x,),
                                          device, dump)
            json.dump({**profile.planned_traffic(compiled.as_text()),
                       "launches": aot.launch_count(dump)}, open(sys.argv[1], "w"))
    """, tmp_path)
    assert out["bytes"] == 4096 * 4096 * 4 + 4096 * 4 and out["launches"] == 1
    assert out["by_kind"] == {"reduction": out["bytes"]} and len(out["largest"]) == 1


def test_a_recorded_run_is_compiled_beside_its_times(tmp_path):
    """``--from DOC``: the timed rows of a speed document compiled for the card they ran on,
    their measured fields kept, the plan's traffic over that card's measured bandwidth beside
    them; rows that did not run (oom) are not compiled."""
    point = {"mechanism": "rnn", "mode": "forward", "scope": "layer", "seq_len": 256,
             "d_model": 128, "num_heads": 2, "d_k": None, "num_features": None, "layers": 6,
             "ffn": 512, "dtype": "bfloat16", "batch": 1, "align": 1, "fused": False}
    doc = {"schema": "flurka.speed/1", "device": {"name": "NVIDIA H200"}, "versions": {},
           "ceilings": {"bfloat16": {"copy_bytes_per_s": 2e12, "matmul_flops_per_s": 6e14}},
           "results": [{**point, "index": 3, "sweep": "tiny", "status": "ok", "median_s": 1e-4,
                        "floor_s": 2e-5, "ratio_to_floor": 5.0},
                       {**point, "seq_len": 512, "index": 4, "sweep": "tiny", "status": "oom"}]}
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    out = tmp_path / "aot.json"
    proc = _run(["-m", "flurka.speed.aot", "--target", "h200", "--from", str(tmp_path / "doc.json"),
                 "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["results"]
    assert (row["index"], row["median_s"], row["ratio_to_floor"], row["status"]) == (3, 1e-4, 5.0, "ok")
    assert row["traffic"]["bytes"] >= 256 * 128 * 2 * 2      # reads x, writes y (bf16) at least
    assert row["traffic_s"] == row["traffic"]["bytes"] / 2e12 and row["launches"] > 0


def test_fused_query_side_reads_q_and_writes_its_output_once(tmp_path):
    """The fused forwards for the card at a length their row blocks do not divide (N = 1000,
    blocks of 128, the appendix-C head dim d_h = m = 128, bf16): one kernel whose traffic is
    exactly q read, the output written in the compute dtype and the key side's small operands —
    the last block's loads and stores are masked, not q padded and the output sliced (two more
    passes over [N, d]) — on a grid of ⌈1000 / 128⌉ row blocks, spill-free on Hopper's
    warpgroup MMA. flurka-eva's chunk half (d_k 128 at N = 1000: chunks of c' = 2 compressed
    rows, 64 summaries, one 64-key step) reads the summaries k̃ and β and their key bias instead
    of KV and Σφ(K), and writes each row's lse beside its output (the window half joins it
    through that); its training step adds the two backward kernels (dq; dK and dV), spill-free
    too."""
    rows = _script("""
        import json, sys, jax
        jax.config.update("jax_platforms", "cpu")
        from flurka.speed import aot
        from flurka.speed.configs import Point
        device = aot.target_device(aot.TARGETS["h100"])
        rows = [aot.compile_point(Point(mechanism, "forward", "layer", 1000, 512, 4, d_k=128,
                                        num_features=128, fused=True), device, None)
                for mechanism in ("flurka-rnn", "flurka-performer", "flurka-eva")]
        rows.append(aot.compile_point(Point("flurka-eva", "train", "layer", 1000, 512, 4,
                                            d_k=128, fused=True), device, None))
        json.dump(rows, open(sys.argv[1], "w"))
    """, tmp_path)
    n, heads, d = 1000, 4, 128
    kernel_side = heads * d * d * 2 + heads * d * 2              # KV [h, m, d], Σφ(K) [h, m]
    key_sides = (kernel_side, kernel_side + d * d * 2,            # FAVOR+ reads ωᵀ [d, m] too
                 2 * 64 * heads * d * 2 + 64 * 4 + heads * n * 4)  # k̃, β [64, h, d]; bias; lse
    *rows, train = rows
    assert train["status"] == "ok", train
    assert {k["kernel"] for k in train["kernels"]} == {
        f"flurka_softmax_query_side{part}" for part in ("", "_dq", "_dkv")}
    assert all(k["spill_store_bytes"] == 0 and k["mma"] == "wgmma" for k in train["kernels"])
    for row, key_side in zip(rows, key_sides):
        assert row["status"] == "ok", row
        q = out = n * heads * d * 2                          # bf16
        assert row["traffic"]["by_kind"]["pallas"] == q + out + key_side, row["traffic"]
        (kernel,) = row["kernels"]
        assert kernel["grid"] == [1, heads, -(-n // 128)], kernel
        assert kernel["spill_store_bytes"] == 0 and kernel["mma"] == "wgmma", kernel


def test_fused_eva_keeps_its_chunk_softmax_off_memory(tmp_path):
    """EVA with its chunk half fused, compiled for the card (N = 2000, d_model 512, 4 heads of
    d_h 128, bf16, windows and chunks of 16: C = 125 chunk summaries, padded to two 64-key
    steps): one kernel whose traffic is exactly q read, the chunk half's output written, the
    summaries k̃ and β, the empty-chunk key bias and each row's lse; the plan moves at least the
    three float32 passes over [N, C] less than the XLA path's (logits written, read by the max
    and by the exp); the training step adds the two backward kernels. All on the warpgroup MMA,
    spill-free."""
    rows = _script("""
        import json, sys, jax
        jax.config.update("jax_platforms", "cpu")
        from flurka.speed import aot
        from flurka.speed.configs import Point
        device = aot.target_device(aot.TARGETS["h100"])
        rows = [aot.compile_point(Point("eva", mode, "layer", 2000, 512, 4, fused=fused),
                                  device, None)
                for mode, fused in (("forward", False), ("forward", True), ("train", True))]
        json.dump(rows, open(sys.argv[1], "w"))
    """, tmp_path)
    assert all(row["status"] == "ok" for row in rows), rows
    xla, fused, train = rows
    n, heads, d, keys = 2000, 4, 128, 128
    q = out = n * heads * d * 2                                       # bf16
    summaries, bias, lse = 2 * keys * heads * d * 2, keys * 4, heads * n * 4
    assert fused["traffic"]["by_kind"]["pallas"] == q + out + summaries + bias + lse
    (kernel,) = fused["kernels"]
    assert kernel["kernel"] == "flurka_softmax_query_side"
    assert kernel["grid"] == [1, heads, -(-n // 128)], kernel
    assert xla["traffic"]["bytes"] - fused["traffic"]["bytes"] >= 3 * n * 125 * heads * 4
    assert {k["kernel"] for k in train["kernels"]} == {
        f"flurka_softmax_query_side{part}" for part in ("", "_dq", "_dkv")}
    assert all(k["spill_store_bytes"] == 0 and k["mma"] == "wgmma"
               for k in fused["kernels"] + train["kernels"])


def test_fused_projections_read_x_and_write_the_layers_output_once(tmp_path):
    """The flash comparison's layer (d_model 512, 4 heads of d_h = m = 128, bf16) at N = 1000
    with W_Q and W_O in the query-side kernel, compiled for the card: one kernel for the query
    half (64-row programs on the warpgroup MMA, spilling ≤ 0.25 KB: ptxas reads 104 B) whose
    traffic is exactly x read, the output written and the weights and key side: Q and the
    per-head context never reach memory."""
    (row,) = _script("""
        import json, sys, jax
        jax.config.update("jax_platforms", "cpu")
        from flurka.speed import aot
        from flurka.speed.configs import Point
        device = aot.target_device(aot.TARGETS["h100"])
        json.dump([aot.compile_point(Point("flurka-rnn", "forward", "layer", 1000, 512, 4,
                                           d_k=128, num_features=128, fused=True,
                                           fused_projections=True), device, None)],
                  open(sys.argv[1], "w"))
    """, tmp_path)
    assert row["status"] == "ok", row
    (kernel,) = row["kernels"]
    assert kernel["kernel"] == "flurka_elu_projected_query_side" and kernel["mma"] == "wgmma"
    assert kernel["grid"] == [-(-1000 // 64), 1, 1] and kernel["spill_store_bytes"] <= 256
    n, d_model, heads, d = 1000, 512, 4, 128
    x = out = n * d_model * 2
    weights = 2 * (d_model * d_model * 2 + d_model * 2)          # W_Q, b_Q, W_O, b_O
    key_side = heads * d * d * 2 + heads * d * 2                 # KV, Σφ(K)
    assert row["traffic"]["by_kind"]["pallas"] == x + out + weights + key_side


def test_fused_ffn_reads_x_and_a_and_writes_the_hidden_layer_and_z_once(tmp_path):
    """A one-block model at the flash comparison's widths (d_model = FFN = 512, bf16) at a length
    its 128-row programs do not divide (N = 1000), compiled for the card with the fused FFN
    block: two kernels, spill-free on Hopper's warpgroup MMA in the card's shared memory, over
    (4 column blocks, 8 row blocks), whose traffic is exactly LN + fc1 reading x and a and writing
    h, fc2 reading h, x and a and writing z, and the weights — and the step's plan moves less
    than the XLA block's."""
    fused, xla = _script("""
        import json, sys, jax
        jax.config.update("jax_platforms", "cpu")
        from flurka.speed import aot
        from flurka.speed.configs import Point
        device = aot.target_device(aot.TARGETS["h100"])
        rows = [aot.compile_point(Point("flurka-rnn", "forward", "model", 1000, 512, 4, d_k=128,
                                        num_features=128, layers=1, ffn=512, fused_ffn=f),
                                  device, None) for f in (True, False)]
        json.dump(rows, open(sys.argv[1], "w"))
    """, tmp_path)
    assert fused["status"] == xla["status"] == "ok"
    assert [(k["kernel"], k["grid"]) for k in fused["kernels"]] == [
        ("flurka_ln_fc1", [4, 8, 1]), ("flurka_fc2_residual", [4, 8, 1])]
    for kernel in fused["kernels"]:
        assert kernel["spill_store_bytes"] == 0 and kernel["mma"] == "wgmma", kernel
        assert kernel["shared_memory_bytes"] <= 232_448 and kernel["threads"] == 8 * 32, kernel
    tensor, weight, vector = 1000 * 512 * 2, 512 * 512 * 2, 512 * 2      # bf16
    ln_fc1 = 3 * tensor + 3 * vector + weight                   # x, a, LN scale/bias, W1, b1 → h
    fc2 = 4 * tensor + weight + vector                          # h, x, a, W2, b2 → z
    assert fused["traffic"]["by_kind"]["pallas"] == ln_fc1 + fc2
    assert "pallas" not in xla["traffic"]["by_kind"]
    assert fused["traffic"]["bytes"] < xla["traffic"]["bytes"]


def test_xla_options_give_the_plan_under_the_cards_gemm_choice(tmp_path):
    """``--xla NAME=VALUE``: compile options for the points, recorded. Without the card XLA
    splits the contraction of E·X (over N = 52 500, for 1024 × 512 outputs) four ways and pads
    E and X to a multiple of the split first (copies of ≥ 2 × E1's 107.5 MB every step); with
    split-K forced off (a choice the card's autotuner may make) the layer moves no copies and at
    least those bytes less; cuBLAS (the autotuner's other choice) pads them too (52 500 is no
    multiple of 8). A batch padded to a multiple of 128 (``pad_to``: 52 608 rows, E built
    for them) needs no copy under either GEMM choice."""
    rows = _script("""
        import dataclasses, json, sys, jax
        jax.config.update("jax_platforms", "cpu")
        from flurka.speed import aot
        from flurka.speed.configs import Point
        device = aot.target_device(aot.TARGETS["h100"])
        point = Point("flurka-rnn", "forward", "layer", 52_500, 512, 4, d_k=1024,
                      num_features=128)
        padded = dataclasses.replace(point, pad_to=128)
        cublas = {"xla_gpu_enable_triton_gemm": False}
        json.dump([aot.compile_point(p, device, None, options) for p, options in
                   ((point, {}), (point, {"xla_gpu_experimental_force_split_k": 1}),
                    (point, cublas), (padded, {}), (padded, cublas))], open(sys.argv[1], "w"))
    """, tmp_path)
    e_bytes = 1024 * 52_500 * 2
    split, whole, cublas, padded, padded_cublas = (row["traffic"] for row in rows)
    for copied in (split, cublas):
        assert copied["by_kind"].get("copy", 0) >= 2 * e_bytes * 2   # E1, E2: each read + written
    for plan in (whole, padded, padded_cublas):       # no copy of E or X (cuBLAS: 3 MB of weights)
        assert plan["by_kind"].get("copy", 0) < e_bytes / 20
    assert whole["bytes"] <= split["bytes"] - 4 * e_bytes
    # the padded batch: 108 more rows (0.2 %), its mask and one read of E1 and E2 (which of the
    # compressed rows see only padding: lowrank.seen_rows), not the copies
    assert padded["bytes"] <= split["bytes"] - 1.5 * e_bytes
    assert padded_cublas["bytes"] <= cublas["bytes"] - 1.5 * e_bytes
    assert rows[3]["pad_to"] == 128 and rows[3]["params_lowrank"] == 2 * 1024 * 52_608


def test_xla_options_are_checked_and_recorded(tmp_path):
    from flurka.speed.configs import xla_option
    assert xla_option("xla_gpu_experimental_force_split_k=1") == \
        ("xla_gpu_experimental_force_split_k", 1)
    assert xla_option("xla_gpu_enable_triton_gemm=false") == ("xla_gpu_enable_triton_gemm", False)
    for bad in ("force_split_k=1", "xla_gpu_enable_triton_gemm"):
        with pytest.raises(Exception, match="NAME=VALUE"):
            xla_option(bad)
    out = tmp_path / "aot.json"
    refused = _run(["-m", "flurka.speed.aot", "--sweep", "tiny", "--xla", "split_k=1", "--out",
                    str(out)], with_compiler=False)
    assert refused.returncode == 2 and "NAME=VALUE" in refused.stderr and not out.exists()
    proc = _run(["-m", "flurka.speed.aot", "--sweep", "tiny", "--points", "0", "--xla",
                 "xla_gpu_experimental_force_split_k=1", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["xla_options"] == {"xla_gpu_experimental_force_split_k": 1}
    assert doc["results"][0]["xla"] == {"xla_gpu_experimental_force_split_k": 1}   # and each row
    assert [r["status"] for r in doc["results"]] == ["ok"]
