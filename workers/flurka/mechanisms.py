"""The attention mechanisms by name, and their families: the one list that attention, training,
results, sweeps, reports and benchmarks import. Plain Python (no JAX), so a sweep's driver or a
database reader can name mechanisms without loading the layers.

FLuRKA-X (Table 5) unifies two constituents: the low-rank one (Linformer: E1, E2 compress the
keys and values from N positions to d_k) and the kernel one X (a feature map φ, or EVA).
"""

from __future__ import annotations

MECHANISMS: tuple[str, ...] = (
    "full", "flash", "linformer", "performer", "rnn", "eva",
    "flurka-performer", "flurka-rnn", "flurka-eva",
)
LOW_RANK = "linformer"                                   # the low-rank constituent
KERNELS: tuple[str, ...] = ("performer", "rnn", "eva")   # the kernel constituents
FLURKA: tuple[str, ...] = tuple(f"flurka-{k}" for k in KERNELS)
KERNEL_OF: dict[str, str] = {f"flurka-{k}": k for k in KERNELS}
COMPRESSED: tuple[str, ...] = (LOW_RANK, *FLURKA)        # the ones with E1, E2 (what d_k sets)
RANDOM_FEATURES: tuple[str, ...] = ("performer", "eva", "flurka-performer", "flurka-eva")
# Up-training bases (``--base``), by family: the variant's low-rank constituent or its kernel one.
BASES: tuple[str, ...] = ("low-rank", "kernel")
# The no-attention control, a task's floor: Linformer at d_k = 1, where every query sees one
# compressed row (with pooled E the mean of the sequence), so no position attends to another.
# A mechanism that does not clear it beyond noise used no attention worth the name.
CONTROL: tuple[str, int] = (LOW_RANK, 1)
CONTROL_LABEL = "no attention"                        # its row (column) in a quality table
CONTROL_NAME = "no attention (linformer d_k=1)"       # and in words


def is_control(mechanism: str, d_k: int | None) -> bool:
    """Whether a run of ``mechanism`` at ``d_k`` is the no-attention control (:data:`CONTROL`)."""
    return (mechanism, d_k) == CONTROL


def check_mechanism(mechanism: str) -> None:
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; choose from {', '.join(MECHANISMS)}")


def constituents(mechanism: str) -> dict[str, str]:
    """``{"low_rank": "linformer", "kernel": X}`` for ``flurka-X``."""
    check_mechanism(mechanism)
    if mechanism not in FLURKA:
        raise ValueError(f"{mechanism!r} is not a FLuRKA variant; choose from {', '.join(FLURKA)}")
    return {"low_rank": LOW_RANK, "kernel": KERNEL_OF[mechanism]}


def base_mechanism(variant: str, base: str) -> str:
    """The mechanism of ``variant``'s up-training ``base`` ("low-rank" or "kernel", :data:`BASES`):
    flurka-rnn with "kernel" -> rnn."""
    if base not in BASES:
        raise ValueError(f"unknown up-training base {base!r}; valid: {', '.join(BASES)}")
    return constituents(variant)["low_rank" if base == "low-rank" else "kernel"]


def base_family(mechanism: str) -> str:
    """The :data:`BASES` word for a base model's mechanism: linformer -> "low-rank", rnn -> "kernel"."""
    if mechanism == LOW_RANK:
        return "low-rank"
    if mechanism in KERNELS:
        return "kernel"
    raise ValueError(f"{mechanism!r} is no up-training base; bases are {LOW_RANK} or one of {', '.join(KERNELS)}")
