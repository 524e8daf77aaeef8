"""What every table from the results database shares: the error for a selection that holds
nothing, the mechanisms' order, and the formats a table is written in. The tables themselves:
:mod:`flurka.results.quality` (the paper's quality tables) and :mod:`flurka.results.speed`.
"""

from __future__ import annotations

import pandas as pd

from flurka.results.records import MECHANISMS


class NoResults(ValueError):
    """The database holds nothing the requested table can be built from."""


def mechanism_order(mechanisms) -> list[str]:
    """``mechanisms`` in the order of :data:`flurka.catalogue.mechanisms.MECHANISMS`."""
    return [m for m in MECHANISMS if m in set(mechanisms)]


FORMATS = ("markdown", "latex", "csv")


def format_table(df: pd.DataFrame, fmt: str = "markdown", floatfmt: str | None = None) -> str:
    """Text of a table: markdown (tabulate), LaTeX (booktabs tabular) or CSV (the values as they
    are: a quality table built with ``numbers=True`` is rounded already).

    Numbers are shown with ``floatfmt``, else the table's ``attrs["floatfmt"]``, else two decimals
    as in the paper; a missing cell is "--".
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    floatfmt = floatfmt or df.attrs.get("floatfmt", ".2f")
    n_index = df.index.nlevels
    flat = df.reset_index()
    if fmt == "csv":
        return flat.to_csv(index=False)
    if fmt == "markdown":
        cells = flat.astype(object).where(flat.notna(), None)
        text = [i for i, col in enumerate(flat.columns) if not pd.api.types.is_numeric_dtype(flat[col])]
        for col in flat.columns[text]:  # mixed (ms and "OOM"): tabulate
            cells[col] = cells[col].map(  # would print their floats unformatted
                lambda v: "--" if v is None or v != v else format(v, floatfmt)
                if isinstance(v, float) else v)
        # Text stays as the table wrote it: tabulate would re-read a column of "13.9" as numbers
        # and print them with floatfmt ("13.90").
        return cells.to_markdown(index=False, floatfmt=floatfmt, missingval="--", disable_numparse=text) + "\n"
    shown = flat.map(lambda v: "--" if v is None or (isinstance(v, float) and v != v)
                     else format(v, floatfmt) if isinstance(v, float) else str(v))
    return shown.to_latex(index=False, escape=True, column_format="l" * n_index + "r" * (flat.shape[1] - n_index))
