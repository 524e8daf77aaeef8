"""mlm-small: byte-level MLM on the CPython standard library's own ``.py`` sources.

Real text present on every machine. The file list is the sorted relative paths
under ``sysconfig.get_paths()["stdlib"]`` (test suites and site-packages left
out); a file is held out for eval when ``crc32(path) % 10 == 0``, so the split
is fixed by the file names alone. The text differs between Python versions.
"""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

from flurka.data.core import DataNotFoundError, Dataset
from flurka.data.mlm import byte_mlm_dataset

_SKIP_PARTS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The sorted ``.py`` files of the standard library, relative to its root."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p.relative_to(root) for p in root.rglob("*.py"))
    return [p for p in files if not _SKIP_PARTS.intersection(p.parts)]


def is_eval_file(path: Path) -> bool:
    return zlib.crc32(path.as_posix().encode()) % 10 == 0


def load_stdlib_text(max_train_bytes: int, max_eval_bytes: int, root: str | Path | None = None) -> tuple[bytes, bytes]:
    """(train, eval) byte streams: whole files in sorted order until each cap is reached."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root) if root.is_dir() else []
    if not files:
        raise DataNotFoundError(
            f"mlm-small reads the CPython standard library sources, but found no .py files under {root}"
        )
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    sizes = {False: 0, True: 0}
    caps = {False: max_train_bytes, True: max_eval_bytes}
    for rel in files:
        held_out = is_eval_file(rel)
        if sizes[held_out] >= caps[held_out]:
            if all(sizes[k] >= caps[k] for k in caps):
                break
            continue
        data = (root / rel).read_bytes()
        parts[held_out].append(data)
        sizes[held_out] += len(data)
    return b"\n".join(parts[False])[:max_train_bytes], b"\n".join(parts[True])[:max_eval_bytes]


def build(
    *, seed: int = 0, data_dir=None, max_len: int = 128, max_train_bytes: int = 3_000_000, max_eval_bytes: int = 200_000
) -> Dataset:
    del data_dir  # ships with Python
    train, eval = load_stdlib_text(max_train_bytes, max_eval_bytes)
    return byte_mlm_dataset("mlm-small", train, eval, max_len=max_len, seed=seed)
