"""Where a step's time goes (flurka.speed.profile): the optimised-HLO classifier on a GPU module's
text, a real trace of a compiled step on this CPU, and the profile riding along a timed point."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from flurka.results.records import speed_records_from_document
from flurka.speed import bench, profile
from flurka.speed.configs import points
from flurka.speed.runner import document

# The shapes of instruction XLA's GPU compiler leaves in an optimised module: cuBLAS and
# cublasLt custom calls, a Triton GEMM fusion, cuDNN flash attention, a Pallas (Triton) kernel,
# loop and reduction fusions, a transpose fusion and a bare copy.
GPU_HLO = """HloModule jit_step, is_scheduled=true

%gemm_fusion_dot.3_computation (parameter_0: bf16[512,128], parameter_1: bf16[128,128]) -> bf16[512,128] {
  %parameter_0 = bf16[512,128]{1,0} parameter(0)
  %parameter_1 = bf16[128,128]{1,0} parameter(1)
  ROOT %dot.1 = bf16[512,128]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_multiply (param_0: f32[512,128], param_1: f32[]) -> bf16[512,128] {
  %param_0 = f32[512,128]{1,0} parameter(0)
  %param_1 = f32[] parameter(1)
  %broadcast.2 = f32[512,128]{1,0} broadcast(%param_1), dimensions={}
  %multiply.1 = f32[512,128]{1,0} multiply(%param_0, %broadcast.2)
  ROOT %convert.1 = bf16[512,128]{1,0} convert(%multiply.1)
}

%region_0.1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %maximum.2 = f32[] maximum(%a, %b)
}

%fused_reduce (param_0.2: f32[512,128]) -> f32[512] {
  %param_0.2 = f32[512,128]{1,0} parameter(0)
  %constant_1 = f32[] constant(-inf)
  ROOT %reduce.1 = f32[512]{0} reduce(%param_0.2, %constant_1), dimensions={1}, to_apply=%region_0.1
}

%fused_transpose (param_0.3: bf16[128,512]) -> bf16[512,128] {
  %param_0.3 = bf16[128,512]{1,0} parameter(0)
  ROOT %transpose.1 = bf16[512,128]{1,0} transpose(%param_0.3), dimensions={1,0}
}

ENTRY %main.9 (x: bf16[512,128], w: bf16[128,128], q: bf16[1,512,4,32]) -> bf16[512,128] {
  %x = bf16[512,128]{1,0} parameter(0)
  %w = bf16[128,128]{1,0} parameter(1)
  %q = bf16[1,512,4,32]{3,2,1,0} parameter(2)
  %cublas-gemm.1.0 = (bf16[512,128]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"alpha_real":1}}
  %cublas-lt-matmul.2 = (f32[512,128]{1,0}, s8[33554432]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul"
  %gemm_fusion_dot.3.0 = bf16[512,128]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_fusion_dot.3_computation, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %custom-call.5.0 = (bf16[1,4,512,32]{3,2,1,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax"
  %custom-call.6 = f32[1,512,4,32]{3,2,1,0} custom-call(%q), custom_call_target="__gpu$xla.gpu.triton", backend_config={name = "flurka_favor_query_side", ir = "tt.dot matmul"}
  %loop_multiply_fusion = bf16[512,128]{1,0} fusion(%gte, %c), kind=kLoop, calls=%fused_multiply
  %input_reduce_fusion = f32[512]{0} fusion(%gte2), kind=kInput, calls=%fused_reduce
  %transpose_fusion = bf16[512,128]{1,0} fusion(%t), kind=kLoop, calls=%fused_transpose
  %copy.3 = bf16[512,128]{0,1} copy(%gemm_fusion_dot.3.0)
  ROOT %rng-bit-generator.1 = (u64[2]{0}, u32[8]{0}) rng-bit-generator(%s), algorithm=rng_philox
}
"""


def test_classifier_on_a_gpu_module():
    kinds = profile.op_kinds(GPU_HLO)
    assert {op: kinds[op] for op in (
        "cublas-gemm.1.0", "cublas-lt-matmul.2", "gemm_fusion_dot.3.0", "custom-call.5.0",
        "custom-call.6", "loop_multiply_fusion", "input_reduce_fusion", "transpose_fusion",
        "copy.3", "rng-bit-generator.1")} == {
        "cublas-gemm.1.0": "gemm", "cublas-lt-matmul.2": "gemm", "gemm_fusion_dot.3.0": "gemm",
        "custom-call.5.0": "attention",
        "custom-call.6": "pallas",            # by its target, not by the words in its config
        "loop_multiply_fusion": "elementwise", "input_reduce_fusion": "reduction",
        "transpose_fusion": "copy", "copy.3": "copy", "rng-bit-generator.1": "other"}


def test_summary_arithmetic():
    times = {"a": {"ns": 6e6, "events": 4, "kernels": {"k1", "k2"}},
             "b": {"ns": 3e6, "events": 2, "kernels": {"b"}},
             "c": {"ns": 1e6, "events": 2, "kernels": {"c"}}}
    s = profile.summarize(times, {"a": "gemm", "b": "elementwise"}, steps=2, top=2)
    assert s["traced_s_per_step"] == pytest.approx(5e-3) and s["ops"] == 3
    assert s["by_kind"] == {"gemm": {"s_per_step": pytest.approx(3e-3), "share": pytest.approx(0.6)},
                            "elementwise": {"s_per_step": pytest.approx(1.5e-3), "share": pytest.approx(0.3)},
                            "other": {"s_per_step": pytest.approx(5e-4), "share": pytest.approx(0.1)}}
    assert [(o["op"], o["events_per_step"], o["kernels"]) for o in s["top_ops"]] == \
        [("a", 2.0, ["k1", "k2"]), ("b", 1.0, ["b"])]
    assert profile.brief(s) == "gemm 60%, elementwise 30%, other 10%"
    assert profile.brief({**s, "source": "host"}).endswith("other 10% (host-side trace)")


def _event(name, ns, **stats):
    return SimpleNamespace(name=name, duration_ns=ns, stats=list(stats.items()))


def test_gpu_trace_reading():
    """The shape of a GPU XSpace: kernels on the device plane's stream lines (with their hlo_op),
    lines the profiler derives from them (counted once, not twice), host threads (ignored when a
    device plane exists), and a kernel without an annotation (kept under its own name)."""
    device = SimpleNamespace(name="/device:GPU:0", lines=[
        SimpleNamespace(name="Stream #13(compute)", events=[
            _event("sm90_xmma_gemm_bf16bf16_bf16f32", 400, hlo_op="cublas-gemm.1.0"),
            _event("cutlass_splitk_reduce", 100, hlo_op="cublas-gemm.1.0"),
            _event("loop_multiply_fusion", 250, hlo_op="loop_multiply_fusion"),
            _event("flurka_favor_query_side", 300)]),
        SimpleNamespace(name="XLA Ops", events=[_event("cublas-gemm.1.0", 500, hlo_op="cublas-gemm.1.0")])])
    host = SimpleNamespace(name="/host:CPU", lines=[
        SimpleNamespace(name="tf_XLAPjRt", events=[_event("loop_multiply_fusion", 9999, hlo_op="x")])])
    times, source = profile.op_times(SimpleNamespace(planes=[host, device]))
    assert source == "device"
    assert profile.op_times(SimpleNamespace(planes=[host]))[1] == "host"   # no device traced
    assert {op: (r["ns"], r["events"]) for op, r in times.items()} == {
        "cublas-gemm.1.0": (500, 2), "loop_multiply_fusion": (250, 1), "kernel:flurka_favor_query_side": (300, 1)}
    s = profile.summarize(times, profile.op_kinds(GPU_HLO), steps=1)
    assert {k: v["s_per_step"] * 1e9 for k, v in s["by_kind"].items()} == pytest.approx(
        {"gemm": 500, "elementwise": 250, "pallas": 300})
    assert s["top_ops"][0]["kernels"] == ["cutlass_splitk_reduce", "sm90_xmma_gemm_bf16bf16_bf16f32"]


def test_command_buffer_trace_is_split_by_kernel():
    """On the H200 (2026-11-27) XLA ran each step as one CUDA graph and the trace gave every
    kernel the graph's hlo_op: the kernels' own names (XLA's fusion names, '.' as '_') say which
    op each is, so the kinds survive."""
    device = SimpleNamespace(name="/device:GPU:0", lines=[
        SimpleNamespace(name="Stream #13(compute)", events=[
            _event("gemm_fusion_dot_3_0", 400, hlo_op="command_buffer_1"),
            _event("input_reduce_fusion", 100, hlo_op="command_buffer_1"),
            _event("transpose_fusion", 50, hlo_op="command_buffer_1"),
            _event("sm90_xmma_gemm_bf16bf16_bf16f32", 200, hlo_op="command_buffer_1"),
            _event("Memset 0", 10, hlo_op="command_buffer_1")])])
    times, _ = profile.op_times(SimpleNamespace(planes=[device]))
    assert set(times) == {"gemm_fusion_dot_3_0", "input_reduce_fusion", "transpose_fusion",
                          "sm90_xmma_gemm_bf16bf16_bf16f32", "Memset 0"}
    s = profile.summarize(times, profile.op_kinds(GPU_HLO), steps=1)
    assert {k: v["s_per_step"] * 1e9 for k, v in s["by_kind"].items()} == pytest.approx(
        {"gemm": 600, "reduction": 100, "copy": 50, "other": 10})
    kinds = profile.op_kinds(GPU_HLO)   # the kernel spelling of a name its words would misread
    assert kinds["custom_call_5_0"] == kinds["custom-call.5.0"] == "attention"


def test_trace_of_a_compiled_step_on_cpu():
    def step(a, b):
        c = a @ b                                         # 2·512³ FLOPs: the bulk of the step
        return jax.nn.softmax(c, axis=-1).sum(0) + jnp.sin(c).mean()

    a, b = (jax.random.normal(jax.random.key(i), (512, 512)) for i in (0, 1))
    compiled = jax.jit(step).lower(a, b).compile()
    s = profile.profile_compiled(compiled, (a, b), steps=3)
    kinds = profile.op_kinds(compiled.as_text())
    assert s["steps"] == 3 and s["ops"] >= 2 and s["traced_s_per_step"] > 0 and s["source"] == "host"
    assert sum(v["share"] for v in s["by_kind"].values()) == pytest.approx(1.0)
    assert s["by_kind"]["gemm"]["s_per_step"] > 0
    assert all(o["op"] in kinds for o in s["top_ops"])   # the trace's ops are the executable's
    gemm_ops = [o for o in s["top_ops"] if o["kind"] == "gemm"]
    assert gemm_ops and all(o["events_per_step"] >= 1 for o in gemm_ops)
    shares = [o["share"] for o in s["top_ops"]]
    assert shares == sorted(shares, reverse=True)
    with pytest.raises(ValueError, match="profile steps"):
        profile.profile_compiled(compiled, (a, b), steps=0)


def test_profile_rides_along_a_timed_point_and_ingests(monkeypatch):
    point = next(p for p in points("tiny", mechanisms=["flurka-rnn"], modes=["train"],
                                   scopes=["layer"]))
    row = bench.run_point(point, None, warmup=0, repeats=1, profile_steps=2)
    assert row["status"] == "ok" and row["median_s"] > 0
    assert row["profile"]["steps"] == 2 and "gemm" in row["profile"]["by_kind"]
    (record,) = speed_records_from_document(document(sweep="tiny", results=[row], ceilings=None,
                                                     settings={}))
    assert record.config["profile"]["by_kind"] == row["profile"]["by_kind"]

    def broken(*args, **kwargs):
        raise RuntimeError("profiler unavailable")
    monkeypatch.setattr(profile, "profile_compiled", broken)
    row = bench.run_point(point, None, warmup=0, repeats=1, profile_steps=2)
    assert row["status"] == "ok" and row["median_s"] > 0          # the timing stands
    assert row["profile"] == {"error": "profiler unavailable"}
