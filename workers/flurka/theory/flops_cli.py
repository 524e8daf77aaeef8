"""``flurka flops``: forward FLOPs of one attention layer per mechanism, and the paper's claims.

Example (the paper's sequence-length sweep, appendix B's regime)::

    flurka flops --seq-len 55500 --d-model 2600 --heads 8 --d-k 1500 --features 325 --json

prints one JSON object per mechanism and line: ``mechanism``, ``flops`` (exact forward FLOPs of
our layer), ``dot_flops`` (its matmul part), ``breakdown`` (per step), ``config``, and for the
FLuRKA variants ``claims`` (the paper's claims 1-3 at this configuration) and
``fewer_than_constituents`` (exact model: fewer FLOPs than linformer / than its kernel); both are
``null`` for the other mechanisms.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from flurka.attention import flops as F
from flurka.theory import cost_model


def positive_int(text: str) -> int:
    """argparse type: a positive integer, or a one-line usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq-len", type=positive_int, required=True, help="sequence length N")
    parser.add_argument("--d-model", type=positive_int, required=True, help="hidden size d_m")
    parser.add_argument("--heads", type=positive_int, required=True, help="number of heads H")
    parser.add_argument("--d-k", type=positive_int, required=True,
                        help="d_k: the length E1, E2 compress the sequence to (Linformer, FLuRKA)")
    parser.add_argument("--features", type=positive_int, default=None,
                        help="FAVOR+ random features per head m (performer, flurka-performer; "
                             "default: the layer's)")
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size (default 1)")
    parser.add_argument("--window-size", type=positive_int, default=None,
                        help="EVA's local window in positions (flurka-eva covers it with "
                             "compressed rows; default: the layers')")
    parser.add_argument("--chunk-size", type=positive_int, default=None,
                        help="EVA's random-feature chunk in positions (flurka-eva: likewise; "
                             "default: the layers')")
    parser.add_argument("--mechanism", action="append", choices=F.MECHANISMS, default=None,
                        help="only this mechanism (repeatable; default: all)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def report(mechanism: str, shape: F.AttentionShape) -> dict:
    """The JSON record of one mechanism at ``shape``."""
    breakdown = F.flop_breakdown(mechanism, shape)
    flurka = mechanism in F.FLURKA
    return {
        "mechanism": mechanism,
        "flops": sum(breakdown.values()),
        "dot_flops": F.dot_flops(mechanism, shape),
        "breakdown": breakdown,
        "config": dataclasses.asdict(shape),
        "claims": cost_model.claims(shape) if flurka else None,
        "fewer_than_constituents": F.fewer_than_constituents(mechanism, shape) if flurka else None,
    }


def _table(records: list[dict]) -> str:
    full = next((r["flops"] for r in records if r["mechanism"] == "full"), None)
    lines = [f"{'mechanism':<18}{'GFLOPs':>14}{'x full':>9}  claims 1/2/3   fewer than"]
    for r in records:
        ratio = f"{r['flops'] / full:9.3f}" if full else f"{'':9}"
        claims = "/".join("yes" if v else "no" for v in r["claims"].values()) \
            if r["claims"] else "-"
        fewer = ", ".join(f"{k}: {'yes' if v else 'no'}"
                          for k, v in r["fewer_than_constituents"].items()) \
            if r["fewer_than_constituents"] else "-"
        lines.append(f"{r['mechanism']:<18}{r['flops'] / 1e9:14.3f}{ratio}  {claims:<13}  {fewer}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        shape = F.AttentionShape(
            batch=args.batch, seq_len=args.seq_len, d_model=args.d_model, num_heads=args.heads,
            d_k=args.d_k, num_features=args.features, window_size=args.window_size,
            chunk_size=args.chunk_size)
        records = [report(m, shape) for m in (args.mechanism or F.MECHANISMS)]
    except ValueError as err:
        print(f"flurka flops: error: {err}", file=sys.stderr)
        return 2
    text = "\n".join(json.dumps(r) for r in records) if args.json else _table(records)
    print(text, flush=True)   # `| head` leaving early: flurka.cli.run_reporting_errors
    return 0
