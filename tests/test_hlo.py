"""The HLO reader: dot FLOPs of compiled modules (CPU-compiled here, GPU texts as XLA writes
them) and what it refuses to count."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from flurka import hlo


def _compile(f, *args):
    return jax.jit(f).lower(*args).compile()


@pytest.mark.parametrize("m,k,n", [(8, 16, 4), (33, 7, 65), (128, 64, 96)])
def test_hlo_counter_plain_matmul(m, k, n):
    c = _compile(jnp.matmul, jnp.ones((m, k)), jnp.ones((k, n)))
    assert hlo.compiled_dot_flops(c) == 2 * m * n * k


def test_hlo_counter_batched_chain_agrees_with_xla():
    def f(a, b, c):
        return jnp.einsum("bnd,bmd->bnm", a, b) @ c

    c = _compile(f, jnp.ones((2, 64, 16)), jnp.ones((2, 32, 16)), jnp.ones((2, 32, 8)))
    expected = 2 * 2 * 64 * 32 * 16 + 2 * 2 * 64 * 8 * 32
    assert hlo.compiled_dot_flops(c) == expected
    assert c.cost_analysis()["flops"] == expected  # XLA's own count: only dots here


def test_hlo_counter_multiplies_loop_bodies_by_trip_count():
    def f(a, w):
        return jax.lax.scan(lambda c, x: (c @ w + x, None), a, jnp.ones((5,) + a.shape))[0]

    c = _compile(f, jnp.ones((8, 16)), jnp.ones((16, 16)))
    assert hlo.compiled_dot_flops(c) == 5 * 2 * 8 * 16 * 16


def test_hlo_counter_convolution():
    # 1-D conv, 2 groups: every output element is (kernel width 3) × (2 input features) MACs.
    def f(x, k):
        return jax.lax.conv_general_dilated(x, k, (1,), "VALID", feature_group_count=2)

    c = _compile(f, jnp.ones((2, 4, 10)), jnp.ones((6, 2, 3)))
    assert hlo.compiled_dot_flops(c) == 2 * (2 * 6 * 8) * (3 * 2)


# GPU-compiled HLO cannot be produced on a CPU machine; these texts follow XLA's GPU output
# (gemm_rewriter: cuBLAS custom-calls returning (result, workspace) with dot_dimension_numbers).
GPU_GEMM_HLO = """HloModule jit_f, is_scheduled=true

ENTRY %main.3 (a.1: f32[4,32,64], b.1: f32[4,64,16]) -> f32[4,32,16] {
  %a.1 = f32[4,32,64]{2,1,0} parameter(0)
  %b.1 = f32[4,64,16]{2,1,0} parameter(1)
  %custom-call.1 = (f32[4,32,16]{2,1,0}, s8[4194304]{0}) custom-call(f32[4,32,64]{2,1,0} %a.1, \
f32[4,64,16]{2,1,0} %b.1), custom_call_target="__cublas$gemm", backend_config={"operation_queue_id":"0",\
"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":\
["2"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  ROOT %get-tuple-element.1 = f32[4,32,16]{2,1,0} get-tuple-element((f32[4,32,16]{2,1,0}, \
s8[4194304]{0}) %custom-call.1), index=0
}
"""


def test_hlo_counter_gpu_gemm_custom_call():
    assert hlo.dot_flops(GPU_GEMM_HLO) == 2 * 4 * 32 * 16 * 64
    assert hlo.dot_flops_by_type(GPU_GEMM_HLO) == {"f32": 2 * 4 * 32 * 16 * 64}
    mixed = GPU_GEMM_HLO.replace("%b.1 = f32[4,64,16]", "%b.1 = bf16[4,64,16]")
    assert hlo.dot_flops_by_type(mixed) == {"bf16×f32": 2 * 4 * 32 * 16 * 64}


def test_hlo_counter_refuses_what_it_cannot_count():
    fmha = GPU_GEMM_HLO.replace('"__cublas$gemm"', '"__cudnn$fmhaSoftmax"').replace(
        '"dot_dimension_numbers"', '"bmm1_dot_dimension_numbers"')
    with pytest.raises(ValueError, match="fused attention"):
        hlo.dot_flops(fmha)
    pallas = GPU_GEMM_HLO.replace('"__cublas$gemm"', '"__gpu$xla.gpu.triton"')
    with pytest.raises(ValueError, match="Pallas kernel"):
        hlo.dot_flops(pallas)
    loop = """HloModule m

%body (p: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %p = (s32[], f32[8,8]{1,0}) parameter(0)
  %x = f32[8,8]{1,0} get-tuple-element(%p), index=1
  %d = f32[8,8]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[8,8]{1,0}) tuple(%i, %d)
}

%cond (p.1: (s32[], f32[8,8])) -> pred[] {
  %p.1 = (s32[], f32[8,8]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[8,8]) -> f32[8,8] {
  %a = f32[8,8]{1,0} parameter(0)
  %z = s32[] constant(0)
  %t0 = (s32[], f32[8,8]{1,0}) tuple(%z, %a)
  %w = (s32[], f32[8,8]{1,0}) while(%t0), condition=%cond, body=%body
  ROOT %r = f32[8,8]{1,0} get-tuple-element(%w), index=1
}
"""
    with pytest.raises(ValueError, match="no known trip count"):
        hlo.dot_flops(loop)
    trip = 'body=%body, backend_config={"known_trip_count":{"n":"7"}}'
    with_trip = loop.replace("body=%body", trip)
    assert hlo.dot_flops(with_trip) == 7 * 2 * 8 * 8 * 8


def test_hlo_counter_rejects_non_hlo():
    with pytest.raises(ValueError, match="ENTRY"):
        hlo.dot_flops("not an hlo module")


def test_operand_names_read_every_form_xla_writes():
    """Plain, typed and index-commented operands (XLA marks every fifth: /*index=5*/), each one
    name; the traffic of a kernel with six operands counts all six."""
    call = ("custom-call(%a.1, f32[2,3]{1,0} %b, c, %d, %e, /*index=5*/%f.2), "
            'custom_call_target="__gpu$xla.gpu.triton"')
    assert hlo.operand_names(call) == ["a.1", "b", "c", "d", "e", "f.2"]
    assert hlo.custom_call_target(call) == "__gpu$xla.gpu.triton"
    assert hlo.nbytes("(bf16[4,8]{1,0}, f32[3], pred[5])") == 4 * 8 * 2 + 3 * 4 + 5
