"""Object storage for a sweep whose nodes share no run dir (``--storage s3://bucket/prefix``).

Ray Tune keeps its experiment state at ``<storage>/tune`` (``RunConfig(storage_path=...)``, which
Ray resolves through ``pyarrow.fs``), and each trial stages its work dir on its node's own disk
and mirrors the checkpoints to ``<storage>/work/<key>`` (:class:`WorkDir`): a retried or resumed
trial, on whichever node, continues from them, an α branch fetches its base's fork checkpoint,
and the driver fetches the best model it logs. Everything goes through ``pyarrow.fs``: S3 and
GCS alike (``gs://`` through pyarrow's GcsFileSystem; only S3 is tested here).

Credentials are the SDK's own on each node (the ``AWS_*`` environment variables, ``~/.aws``, an
instance role), never the URI's: the sweep's spec refuses a URI with a user, a password or a
query string (:func:`flurka.sweeps.spec.storage_problem`), so the URI itself may be stored and
logged. An S3-compatible server's endpoint is
``AWS_ENDPOINT_URL``; the driver forwards its endpoint and region, never its keys, to the
sweep's workers (:func:`forwarded_env`).

A checkpoint step is uploaded file by file and then named in ``<work>/steps.json`` (one object,
which S3 replaces whole): a reader fetches only the steps that object names, so a trial killed
mid-upload leaves no half step to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from flurka.cluster import ClusterError, ask_each_node, name_nodes

# Not secrets: where the storage is. The keys stay where each node's SDK finds them.
FORWARDED_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")
MANIFEST = "steps.json"
NODE_CHECK_TIMEOUT_S = 60.0


class StorageError(ClusterError):
    """The sweep's object storage cannot be used (a bad URI, an endpoint nobody answers on, a
    missing bucket, refused credentials); the message is one line."""


def join(uri: str, *parts: str) -> str:
    """``uri`` with path components appended (object stores have no relative paths)."""
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def forwarded_env(environ=os.environ) -> dict[str, str]:
    """The driver's storage settings that the workers need too (endpoint, region), no secret."""
    return {k: environ[k] for k in FORWARDED_ENV if environ.get(k)}


def _why(exc: BaseException) -> str:
    """The SDK's reason in one short line (without its request ids)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = re.sub(r"\s*\(Request ID: [^)]*\)", "", text)
    return text if len(text) <= 240 else text[:239] + "…"


def filesystem(uri: str):
    """(pyarrow file system, path inside it) of ``uri``; StorageError in one line."""
    import pyarrow.fs as pafs   # Ray's own dependency; imported where storage is used

    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError, a missing GCS build: one line either way
        raise StorageError(f"--storage {uri}: {_why(exc)}") from None


def _put(fs, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as f:
        f.write(data)


def _get(fs, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def probe(uri: str) -> None:
    """The driver reaches ``uri``: one marker object written under it, read back and deleted
    (the endpoint answers, the bucket exists, the credentials may write). StorageError naming
    the SDK's reason otherwise. Run before Ray starts."""
    fs, root = filesystem(uri)
    token = uuid.uuid4().hex
    path = f"{root.rstrip('/')}/.flurka-probe-{token}"
    try:
        _put(fs, path, token.encode())
        back = _get(fs, path).decode(errors="replace")
        fs.delete_file(path)
    except Exception as exc:  # noqa: BLE001 - OSError mostly; whatever the SDK raises is the user's line
        raise StorageError(f"--storage {uri}: cannot write an object there and read it back: {_why(exc)}") from None
    if back != token:
        raise StorageError(f"--storage {uri}: an object written there read back different")


def _node_reaches(uri: str, marker: str, token: str) -> str:
    """On one node: "yes" if it reads the driver's marker and writes (and deletes) its own object
    under ``uri``, else why not."""
    try:
        fs, root = filesystem(uri)
        if _get(fs, marker).decode(errors="replace") != token:
            return "it reads a different marker"
        own = f"{root.rstrip('/')}/.flurka-node-{uuid.uuid4().hex}"
        _put(fs, own, token.encode())
        fs.delete_file(own)
        return "yes"
    except Exception as exc:  # noqa: BLE001 - the node is named with the reason
        return _why(exc)


def check_nodes(uri: str, *, embedded: bool, timeout_s: float = NODE_CHECK_TIMEOUT_S) -> None:
    """Every alive node reaches ``uri`` with its own workers' settings: the driver writes a marker
    object, one task pinned to each node (``num_cpus=0``) reads it and writes one of its own; a
    node that cannot, or does not answer in ``timeout_s``, is named in one line (StorageError).
    Nothing to check on the embedded instance, whose workers are this process's children (its
    :func:`probe` answered for them). Nodes that join later are not checked."""
    if embedded:
        return
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        return
    fs, root = filesystem(uri)
    token = uuid.uuid4().hex
    marker = f"{root.rstrip('/')}/.flurka-check-{token}"
    try:
        _put(fs, marker, token.encode())
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"--storage {uri}: cannot write an object there: {_why(exc)}") from None
    try:
        failing = ask_each_node(nodes, _node_reaches, uri, marker, token, timeout_s=timeout_s)
    finally:
        with contextlib.suppress(Exception):
            fs.delete_file(marker)
    if failing:
        raise StorageError(f"--storage {uri} is out of reach of {len(failing)} of the cluster's {len(nodes)} nodes: "
                           f"{name_nodes(failing)}; give every node the endpoint and credentials (AWS_ENDPOINT_URL, AWS_* or "
                           "~/.aws on each node)")


def write_json(uri: str, value) -> None:
    """``value`` as the JSON object at ``uri`` (replaced whole)."""
    fs, path = filesystem(uri)
    _put(fs, path, json.dumps(value, indent=1).encode())


def read_json(uri: str):
    """The JSON object at ``uri``, or None where there is none."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    try:
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        return json.loads(_get(fs, path))
    except Exception as exc:  # noqa: BLE001 - OSError from the SDK, a damaged object: one line either way
        raise StorageError(f"--storage: cannot read {uri}: {_why(exc)}") from None


class WorkDir:
    """One planned run's work dir: staged at ``local`` (this node's disk, where Orbax writes) and
    mirrored at ``remote`` (``<storage>/work/<key>``). Only finished checkpoint steps travel
    (``checkpoints/<step>``: Orbax renames a step into place once written)."""

    def __init__(self, remote: str, local: str | os.PathLike):
        self.uri, self.local = remote, Path(local)
        self.fs, self.root = filesystem(remote)
        self.root = self.root.rstrip("/")
        self._uploaded: list[int] | None = None   # steps.json as this process last read or wrote it

    def _manifest(self) -> str:
        return f"{self.root}/{MANIFEST}"

    def remote_steps(self) -> list[int]:
        """The steps uploaded whole (named in ``steps.json``)."""
        import pyarrow.fs as pafs

        if self.fs.get_file_info(self._manifest()).type != pafs.FileType.File:
            self._uploaded = []
        else:
            self._uploaded = sorted(int(s) for s in json.loads(_get(self.fs, self._manifest())).get("steps", []))
        return list(self._uploaded)

    def local_steps(self) -> list[int]:
        ckpts = self.local / "checkpoints"
        if not ckpts.is_dir():
            return []
        return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit() and p.is_dir())

    def pull(self, steps: Iterable[int] | None = None) -> list[int]:
        """Fetch the uploaded steps (of ``steps`` only, where given) that the local dir lacks; each
        lands whole (downloaded beside, then renamed into ``checkpoints/``). Returns them."""
        import pyarrow.fs as pafs

        have = set(self.local_steps())
        wanted = None if steps is None else set(steps)
        fetch = [s for s in self.remote_steps() if s not in have and (wanted is None or s in wanted)]
        if not fetch:
            return []
        (self.local / "checkpoints").mkdir(parents=True, exist_ok=True)
        for step in fetch:
            tmp = self.local / f".pull-{step}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            pafs.copy_files(f"{self.root}/checkpoints/{step}", str(tmp), source_filesystem=self.fs,
                            destination_filesystem=pafs.LocalFileSystem())
            try:
                os.rename(tmp, self.local / "checkpoints" / str(step))
            except OSError:      # another trial of this node fetched it meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
        return fetch

    def push(self) -> list[int]:
        """Upload the finished local steps not uploaded yet, then ``steps.json`` naming the local
        steps; a step Orbax dropped locally (``keep_checkpoints``) is dropped from storage after
        that. Returns the steps uploaded. Between steps it reads only the local dir (called at
        every report): storage is read once, then this process's own writes are what it holds."""
        import pyarrow.fs as pafs

        local = self.local_steps()
        remote = self._uploaded if self._uploaded is not None else self.remote_steps()
        if local == remote:
            return []
        new = [s for s in local if s not in remote]
        gone = [s for s in remote if s not in local]
        for step in new:
            pafs.copy_files(str(self.local / "checkpoints" / str(step)), f"{self.root}/checkpoints/{step}",
                            source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)
        _put(self.fs, self._manifest(), json.dumps({"steps": local}).encode())
        self._uploaded = list(local)
        for step in gone:
            with contextlib.suppress(OSError):
                self.fs.delete_dir(f"{self.root}/checkpoints/{step}")
        return new


__all__ = ["StorageError", "WorkDir", "join", "forwarded_env", "filesystem", "probe", "check_nodes",
           "write_json", "read_json", "FORWARDED_ENV"]
