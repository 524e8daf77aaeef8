"""Arrays decoded once and kept under the data dir, so a loader's batch is a gather, not a decode.

Decoding an example per access (a PNG, a review's bytes) costs more than a small model's GPU step;
decoding a split once and reading it back as arrays does not. One entry is a folder
``<data_dir>/arrays/<name>-<key>/`` of ``.npy`` files and a ``manifest.json`` (the key, what it was
built from, each array's dtype and shape). ``key`` is a sha256 over ``spec``, what defines the
arrays: the source's identity (files' names, sizes and mtimes; a TFDS split's name, version and
files) and the encoding's options and format version. Changing any of them builds a new entry;
nothing else rebuilds one.

An entry is built in a temporary folder and renamed into place, one process builds while the
others wait on a lock file, and an entry whose manifest or files do not match what it records
(truncated, overwritten) is built again. Entries are memory-mapped read-only, so worker threads
and processes share one copy in the page cache. A data dir that cannot be written keeps the
arrays in memory (a warning says so). Arrays larger than memory (ImageNet's pixels) are written
in place into the entry's memory maps (:func:`cached_memmaps`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from flurka.data.core import resolve_data_dir

CACHE_DIR = "arrays"
FORMAT = 1   # the entry layout; part of every key
MANIFEST = "manifest.json"


def digest(spec: Mapping) -> str:
    """sha256 over a JSON-able mapping, key order aside (16 hex digits)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_identity(*paths: os.PathLike | str) -> list:
    """Each file's name, size and mtime: a file rewritten or replaced changes it, a data dir moved
    or copied with its times kept does not (reading a 1 GB TSV to hash it is what a cache avoids)."""
    out = []
    for path in map(Path, paths):
        st = path.stat()
        out.append([path.name, st.st_size, st.st_mtime_ns])
    return out


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all: written beside it, synced, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def file_lock(path: Path):
    """Hold ``path``'s lock file (one process builds, the others then load); yields whether the
    folder it lives in is writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.parent / f".{path.name}.lock", "a")
    except OSError:
        yield False
        return
    with handle:
        try:
            import fcntl
        except ImportError:   # not POSIX: no lock, the rename still keeps entries whole
            yield True
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def entry_path(name: str, spec: Mapping, data_dir=None) -> Path:
    """Where the arrays ``name`` of ``spec`` are kept."""
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip("_.") or "arrays"
    return resolve_data_dir(data_dir) / CACHE_DIR / f"{slug}-{digest({'format': FORMAT, **spec})}"


def cached_arrays(name: str, spec: Mapping | None, build: Callable[[], dict[str, np.ndarray]], *,
                  data_dir=None, enabled: bool = True) -> dict[str, np.ndarray]:
    """``build()``'s arrays, from the entry for ``spec`` when one is whole, else built now and kept.

    ``spec=None`` (a source with no identity to key on, e.g. examples already in memory) or
    ``enabled=False`` builds them in memory and writes nothing."""
    if spec is None or not enabled:
        return build()
    folder = entry_path(name, spec, data_dir)
    key = folder.name.rsplit("-", 1)[-1]
    arrays = _load(folder, key)
    if arrays is not None:
        return arrays
    with file_lock(folder) as writable:
        arrays = _load(folder, key)   # another process may have built it while this one waited
        if arrays is not None:
            return arrays
        if folder.exists():
            warnings.warn(f"cached arrays {folder} are damaged; building them again", stacklevel=2)
        arrays = build()
        if not writable:
            warnings.warn(f"cannot write under {folder.parent}: the {name} arrays are kept in memory "
                          f"and built again by every process", stacklevel=2)
            return arrays
        try:
            _save(folder, key, spec, arrays)
        except OSError as err:
            warnings.warn(f"could not cache the {name} arrays at {folder} ({err}); they are kept in memory",
                          stacklevel=2)
            return arrays
    return _load(folder, key) or arrays


def _save(folder: Path, key: str, spec: Mapping, arrays: Mapping[str, np.ndarray]) -> None:
    def write(tmp: Path) -> dict:
        meta = {}
        for field, value in arrays.items():
            value = np.asarray(value)
            with open(tmp / _file(field), "wb") as f:
                np.save(f, value, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            meta[field] = {"dtype": value.dtype.str, "shape": list(value.shape)}
        return meta
    _commit(folder, key, spec, write)


def _file(field: str) -> str:
    if not field.isidentifier():
        raise ValueError(f"array names must be identifiers (file names), got {field!r}")
    return f"{field}.npy"


def _commit(folder: Path, key: str, spec: Mapping, write: Callable[[Path], dict]) -> None:
    """``write(tmp)`` fills a temporary folder beside ``folder`` and returns each array's
    dtype and shape; the folder, with its manifest, then replaces ``folder`` whole."""
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        meta = write(tmp)
        manifest = {"key": key, "format": FORMAT, "spec": spec, "arrays": meta}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
        if folder.exists():   # a damaged entry; the lock is held, so nobody else replaces it now
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def cached_memmaps(name: str, spec: Mapping, layout: Mapping[str, tuple[tuple[int, ...], str]],
                   fill: Callable[[dict[str, np.ndarray]], None], *, data_dir=None) -> dict[str, np.ndarray] | None:
    """:func:`cached_arrays` for arrays larger than memory: ``layout`` gives each array's (shape,
    dtype), and ``fill(arrays)`` writes the entry's memory-mapped files in place (same key, lock and
    atomic rename). None, with a warning, where the entry cannot be written (a read-only data dir,
    less free space than the arrays need): the caller then decodes per access."""
    folder = entry_path(name, spec, data_dir)
    key = folder.name.rsplit("-", 1)[-1]
    arrays = _load(folder, key)
    if arrays is not None:
        return arrays
    need = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in layout.values())
    with file_lock(folder) as writable:
        arrays = _load(folder, key)
        if arrays is not None:
            return arrays
        free = shutil.disk_usage(folder.parent).free if writable else 0
        if not writable or free < need:
            why = f"cannot write under {folder.parent}" if not writable else (
                f"{folder.parent} has {free / 1e9:.1f} GB free, the arrays need {need / 1e9:.1f} GB")
            warnings.warn(f"{why}: the {name} examples are decoded per batch instead", stacklevel=2)
            return None
        if folder.exists():
            warnings.warn(f"cached arrays {folder} are damaged; building them again", stacklevel=2)

        def write(tmp: Path) -> dict:
            maps = {field: np.lib.format.open_memmap(tmp / _file(field), mode="w+", dtype=np.dtype(dtype),
                                                    shape=tuple(shape))
                    for field, (shape, dtype) in layout.items()}
            fill(maps)
            for value in maps.values():
                value.flush()
                with open(value.filename, "rb+") as f:
                    os.fsync(f.fileno())
            return {field: {"dtype": v.dtype.str, "shape": list(v.shape)} for field, v in maps.items()}
        _commit(folder, key, spec, write)
    return _load(folder, key)


def _load(folder: Path, key: str) -> dict[str, np.ndarray] | None:
    """The entry's arrays (read-only memory maps), or None when it is missing or not whole."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest["key"] != key or manifest["format"] != FORMAT:
            return None
        out = {}
        for field, meta in manifest["arrays"].items():
            path = folder / f"{field}.npy"
            value = np.load(path, mmap_mode="r", allow_pickle=False)
            if (value.dtype.str != meta["dtype"] or list(value.shape) != meta["shape"]
                    or value.offset + value.nbytes != path.stat().st_size):
                return None
            out[field] = np.asarray(value)
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):   # JSONDecodeError: a ValueError
        return None
