"""The paper's cost model (appendix B) term by term, and claims 1-3 at the paper's
configurations and as the cost inequalities they state."""

from __future__ import annotations

import itertools

import pytest

from flurka.attention.flops import AttentionShape
from flurka.theory import cost_model as C

PAPER = dict(d_m=2600, d_k=1500, d_h=325, H=8)  # appendix B / §4.1 sequence-length sweep


def test_paper_cost_terms():
    # Each equation at a point where every term is distinguishable (powers of different primes).
    N, d_m, d_k, d_h, H = 7.0, 3.0, 2.0, 5.0, 11.0
    low = 2*N*d_k*d_m + N*d_m**2 + 2*d_k*d_m**2 + N*d_m*d_k + N*H*d_k + N*d_k*d_m
    ker = 3*N*d_m**2 + 2*N*d_m + 2*N*d_m*d_h
    swift = 2*N*d_k*d_m + N*d_m**2 + 2*d_k*d_m**2 + N*d_m + d_m*d_k + d_k*d_m*d_h + N*d_h*d_m
    assert C.paper_cost("low-rank", N, d_m, d_k, d_h, H) == low
    assert C.paper_cost("kernel", N, d_m, d_k, d_h, H) == ker
    assert C.paper_cost("flurka", N, d_m, d_k, d_h, H) == swift
    with pytest.raises(ValueError, match="low-rank, kernel, flurka"):
        C.paper_cost("sparse", N, d_m, d_k, d_h, H)
    # the speedup at raw sizes, d_h = d_m // H: here 55 // 11 = 5, the point above with d_m = 55
    d_m = 55.0
    low = 2*N*d_k*d_m + N*d_m**2 + 2*d_k*d_m**2 + N*d_m*d_k + N*H*d_k + N*d_k*d_m
    swift = 2*N*d_k*d_m + N*d_m**2 + 2*d_k*d_m**2 + N*d_m + d_m*d_k + d_k*d_m*d_h + N*d_h*d_m
    assert C.paper_speedup_at("low-rank", N, d_m, d_k, H) == pytest.approx(low / swift, rel=1e-15)


def test_claims_at_the_papers_configurations():
    assert C.claim1(55500, **PAPER)
    assert not C.claim1(7050, **PAPER)  # d_k(H+2) = 15000 > 7050
    assert C.claim2(7050, PAPER["d_k"], PAPER["d_h"])
    assert not C.claim3(7050, PAPER["d_m"], PAPER["d_k"], PAPER["H"])
    s = AttentionShape(1, 55500, 2600, 8, d_k=1500, num_features=325)
    assert C.claims(s) == {"claim1": True, "claim2": True, "claim3": True}
    # the N thresholds: the claims' predicates switch exactly there (strict inequalities)
    assert C.claim_bounds(2600, 1500, 8) == {"low-rank": 1501, "kernel": 15000}
    for n, expected in ((1501, False), (1502, True)):
        assert C.claims_at(n, 2600, 1500, 8)["claim2"] is expected
    for n, expected in ((15000, False), (15001, True)):
        assert C.claims_at(n, 2600, 1500, 8)["claim3"] is expected
    assert C.claim_bounds(512, 1024, 8) == {"low-rank": 1025, "kernel": None}    # d_m ≤ d_k
    assert C.claim_bounds(2600, 300, 8) == {"low-rank": None, "kernel": 3000}    # d_k ≤ d_h = 325


def test_claims_imply_the_cost_inequalities_they_state():
    """The paper's arguments, checked numerically: in each regime (with d_m = H·d_h, the paper's
    assumption) FLuRKA's cumulative cost is below low-rank's / kernel's."""
    checked = {1: 0, 2: 0, 3: 0}
    for N, d_k, d_h, H in itertools.product([64, 500, 3001, 20000, 90000], [16, 100, 1500, 4000],
                                            [8, 64, 325], [1, 2, 8, 16]):
        d_m = H * d_h
        low, ker, fl = (C.paper_cost(k, N, d_m, d_k, d_h, H) for k in C.PAPER_KINDS)
        if C.claim2(N, d_k, d_h):
            checked[2] += 1
            assert fl < low, (N, d_m, d_k, d_h, H)
        if C.claim3(N, d_m, d_k, H):
            checked[3] += 1
            assert fl < ker, (N, d_m, d_k, d_h, H)
        if C.claim1(N, d_m, d_k, d_h, H):
            checked[1] += 1
            assert fl < low and fl < ker, (N, d_m, d_k, d_h, H)
    assert min(checked.values()) >= 5, checked  # every regime was actually exercised
