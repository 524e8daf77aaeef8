"""The paper's approximate cost model of one MHSA layer and the three claims stated on it
(appendix B: eqs. low-rank-cum, kernel-cum, swift-cum; claims 1-3).

Kept verbatim, apart from the exact FLOP model of our layers (:mod:`flurka.attention.flops`),
because the claims are inequalities *of this model*: the report and ``flurka flops`` set them
against the exact counts and against measured step times.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:   # annotations only: the module itself stays plain Python (flurka.attention brings JAX)
    from flurka.attention.flops import AttentionShape

PAPER_KINDS = ("low-rank", "kernel", "flurka")


def paper_cost(kind: str, N: float, d_m: float, d_k: float, d_h: float, H: float) -> float:
    """Appendix B's cumulative runtime of one MHSA layer (eqs. low-rank-cum, kernel-cum,
    swift-cum), in the paper's notation: d_h is the head hidden size, which the paper also takes
    as the kernel's feature dimension. Counts multiply-adds loosely; only differences matter."""
    if kind == "low-rank":
        return 2 * N * d_k * d_m + N * d_m**2 + 2 * d_k * d_m**2 + N * d_m * d_k + N * H * d_k \
            + N * d_k * d_m
    if kind == "kernel":
        return 3 * N * d_m**2 + 2 * N * d_m + 2 * N * d_m * d_h
    if kind == "flurka":
        return 2 * N * d_k * d_m + N * d_m**2 + 2 * d_k * d_m**2 + N * d_m + d_m * d_k \
            + d_k * d_m * d_h + N * d_h * d_m
    raise ValueError(f"unknown cost kind {kind!r}; choose from {', '.join(PAPER_KINDS)}")


def claim1(N: float, d_m: float, d_k: float, d_h: float, H: float) -> bool:
    """Claim 1 (§3): N > d_k(H+2) > d_m > d_k > d_h ⇒ FLuRKA beats both constituents."""
    return N > d_k * (H + 2) > d_m > d_k > d_h


def claim2(N: float, d_k: float, d_h: float) -> bool:
    """Claim 2 (app. B): N − 1 > d_k > d_h ⇒ FLuRKA beats low-rank."""
    return N - 1 > d_k > d_h


def claim3(N: float, d_m: float, d_k: float, H: float) -> bool:
    """Claim 3 (app. B): N > d_k(H+2) and d_m > d_k ⇒ FLuRKA beats kernel methods."""
    return N > d_k * (H + 2) and d_m > d_k


def claims(shape: AttentionShape) -> dict[str, bool]:
    """The three claims at a layer shape (paper's d_h = our head size d_model / heads)."""
    if shape.d_k is None:
        raise ValueError("the paper's claims need d_k (the low-rank projected length)")
    return claims_at(shape.seq_len, shape.d_model, shape.d_k, shape.num_heads)


def claims_at(N: float, d_m: float, d_k: float, H: float) -> dict[str, bool]:
    """The three claims at raw sizes (measured rows: no shape validation), d_h = d_m // H."""
    d_h = d_m // H
    return {"claim1": claim1(N, d_m, d_k, d_h, H), "claim2": claim2(N, d_k, d_h),
            "claim3": claim3(N, d_m, d_k, H)}


def paper_speedup_at(kind: str, N: float, d_m: float, d_k: float, H: float) -> float:
    """FLuRKA's speedup over ``kind`` ("low-rank" or "kernel") by the paper's cost model
    (:func:`paper_cost`) at raw sizes, d_h = d_m // H."""
    d_h = d_m // H
    return paper_cost(kind, N, d_m, d_k, d_h, H) / paper_cost("flurka", N, d_m, d_k, d_h, H)


def claim_bounds(d_m: float, d_k: float, H: float) -> dict[str, float | None]:
    """The N above which the claims promise FLuRKA beats each constituent, at raw sizes: low-rank
    by claim 2 (N > d_k + 1, given d_k > d_h), the kernel by claim 3 (N > d_k(H+2), given
    d_m > d_k; claim 1's N bound too); None where the size condition fails."""
    d_h = d_m // H
    return {"low-rank": d_k + 1 if d_k > d_h else None,
            "kernel": d_k * (H + 2) if d_m > d_k else None}
