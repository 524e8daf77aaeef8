"""The input pipeline against the GPU: examples/s this host delivers per benchmark at the paper's
batch size, next to the examples/s a training step would take at the GPU step times on record.

    python benchmarks/input_pipeline.py --out benchmarks/results/cpu/DIR/input-pipeline.json

Per benchmark (every registered config: the paper's and the small sets), one ``Dataset`` built by
the benchmark's own loader, then training batches ``train_batch(k, batch_size)`` at the config's
batch size, timed three ways:

- ``serial``: on the calling thread (``prefetch=0``, the loop before prefetching);
- ``threads``: through ``train_batches(prefetch=4)`` (:mod:`flurka.data.prefetch`, one thread per
  core), consumed as fast as they come: what the pipeline can deliver;
- ``processes`` (``--processes``: the heavy loaders by default): the same batches built by a
  ``ProcessPoolExecutor`` of one process per core, each rebuilding the data set, the batches
  pickled back: the alternative to threads, measured to decide between them.

The paper's data sets are not on this machine (nothing is downloaded), so each loader reads what
can be built offline, in its documented layout: files written under a temporary data dir
(WikiText-103 raw text, the LRA release's AAN TSVs, ListOps TSVs, Pathfinder's PNGs), or,
for the TFDS sets, the loader's TFDS split replaced by records decoded on access as
``tfds.data_source`` decodes them (images stored as JPEG/PNG bytes, decoded by TFDS's own
``Image`` feature; text as bytes): reading the array_record file and parsing its protos is not
measured. The LRA loaders and ImageNet decode a split once into arrays under the data dir
(:mod:`flurka.data.cache`; a stand-in split keyed by its name, split and size): ``build_s``
includes that, ``rebuild_s`` (a second build) reads them back; ``--no-cache`` times the
per-example decode instead (``cache=False``). Text is the CPython standard library's sources cut
to the sets' typical lengths; ImageNet's JPEGs are 500x375 crops of scikit-learn's two sample
photos (quality 90). Each row says what it read (``source``). SentencePiece vocabularies the
configs ask for are trained on that text (fewer pieces than 32k: ``build_warnings``), which
shrinks the output layer in the FLOP count below: the need is overstated by it, never understated.

The step's side: ``benchmarks/results/{h100,h200}`` time lone attention layers and one 6-layer model
at N = 52.5k, batch 1 (flash comparison): no whole-model training step of any benchmark is on
record, and each row says so (``step_time_on_record: null``). What it gives instead is a bound:
the step's FLOPs by the FLOP model (the benchmark's model and batch, the mechanism with the fewest
FLOPs) at the card's measured bf16 matmul rate (``ceilings``): no step can be faster, so no step
needs more examples/s (``needed_at_floor``); the leases' steps ran 1.3-5.8x their floors.

JAX is used only for the FLOP model (no device work). Runs in under 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as _dt
import inspect
import io
import json
import multiprocessing
import os
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import numpy as np

from flurka.data.prefetch import default_workers

SCHEMA = "flurka.data.pipeline/1"
ROOT = Path(__file__).resolve().parent
RECORDS = {"h100": ROOT / "results/h100/2026-11-28/n-sweep.json", "h200": ROOT / "results/h200/2026-12-04/run1/n-sweep.json"}
PREFETCH = 4
DEFAULT_PROCESSES = ("imagenet", "glue-mnli")   # decoding that frees the GIL (PIL, NumPy); Python that holds it
# training-split sizes (the stand-in sources index this many examples, so the epoch permutation has
# the real set's size; records repeat a smaller pool). WMT'14's 4.5M pairs cut to 8k: its
# SentencePiece vocabulary reads the split up to 10^7 characters, and would read the same pool over.
TRAIN_SIZES = {"cola": 8_551, "sst2": 67_349, "mrpc": 3_668, "stsb": 5_749, "qqp": 363_846, "mnli": 392_702,
               "qnli": 104_743, "rte": 2_490, "imdb": 25_000, "cifar10": 45_000, "wmt14": 8_000,
               "imagenet2012": 1_281_167}
# ImageNet's train split when its loader caches the decoded resizes: 252 GB for the real 1.28M
# images, 0.8 GB for these (the gather and crop read a map the page cache holds, as a host with the
# memory for ImageNet's would; from disk, its read rate bounds them)
CACHED_IMAGENET = 4_096
# typical lengths in bytes (min, max) of the stand-in texts
LENGTHS = {"glue": (30, 220), "imdb": (400, 3_000), "wmt14": (40, 260), "aan": (2_000, 12_000)}


# ---- offline stand-ins for the data sets ----------------------------------------------------------
class Corpus:
    """Real text to cut pieces from: the CPython standard library's sources."""

    def __init__(self, size: int = 4_000_000):
        from flurka.data.stdlib_text import load_stdlib_text

        self.data, _ = load_stdlib_text(size, 1)
        self.rng = np.random.default_rng(0)

    def pieces(self, n: int, lengths: tuple[int, int], *, flat: bool = False) -> list[bytes]:
        out = []
        for _ in range(n):
            k = int(self.rng.integers(*lengths))
            start = int(self.rng.integers(0, len(self.data) - k))
            piece = self.data[start:start + k]
            out.append(piece.replace(b"\t", b" ").replace(b"\n", b" ") if flat else piece)
        return out


class Records(Sequence):
    """A TFDS split stand-in: ``size`` examples over a pool of records, each decoded on access."""

    def __init__(self, pool: list[dict], size: int, decode=None, *, name: str = "", split: str = ""):
        self.pool, self.size, self.decode = pool, size, decode
        self.name, self.split = name, split

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i):
        record = self.pool[int(i) % len(self.pool)]
        return record if self.decode is None else self.decode(record)


def _encoded_images(kind: str, n: int) -> list[bytes]:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images   # two 427x640 photos
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        photo = photos[i % 2]
        if kind == "jpeg":   # an ImageNet-sized photo
            h, w = 375, 500
        else:                # a CIFAR-10 image
            h, w = 96, 96
        top, left = int(rng.integers(0, photo.shape[0] - h)), int(rng.integers(0, photo.shape[1] - w))
        img = Image.fromarray(photo[top:top + h, left:left + w])
        buf = io.BytesIO()
        if kind == "jpeg":
            img.save(buf, format="JPEG", quality=90)
        else:
            img.resize((32, 32), Image.BILINEAR).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def tfds_stand_ins(corpus: Corpus, imagenet_train: int = TRAIN_SIZES["imagenet2012"]) -> dict[str, dict[str, Records]]:
    """TFDS name -> split -> stand-in source, for the names the loaders ask for."""
    import tensorflow_datasets as tfds

    from flurka.data.tfds_sets import GLUE

    image = tfds.features.Image(shape=(None, None, 3))
    rng = np.random.default_rng(2)

    def decode_image(record):
        return {"image": image.decode_example_np(record["image"]), "label": record["label"]}

    out: dict[str, dict[str, Records]] = {}
    for task, (fields, classes, eval_split) in GLUE.items():
        pool = [{**{f: t for f, t in zip(fields, corpus.pieces(len(fields), LENGTHS["glue"]))},
                 "label": float(rng.random() * 5) if classes == 1 else int(rng.integers(classes))} for _ in range(512)]
        splits = ["train", eval_split, "validation_mismatched"]
        out[f"glue/{task}"] = {s: Records(pool, TRAIN_SIZES[task] if s == "train" else 64, name=f"glue/{task}", split=s)
                               for s in splits}
    imdb = [{"text": t, "label": int(rng.integers(2))} for t in corpus.pieces(256, LENGTHS["imdb"])]
    out["imdb_reviews/plain_text"] = {s: Records(imdb, TRAIN_SIZES["imdb"] if s == "train" else 64,
                                                 name="imdb_reviews/plain_text", split=s) for s in ("train", "test")}
    for target in ("de", "fr"):
        pool = [{"en": a, target: b} for a, b in zip(corpus.pieces(512, LENGTHS["wmt14"]),
                                                     corpus.pieces(512, LENGTHS["wmt14"]))]
        out[f"wmt14_translate/{target}-en"] = {s: Records(pool, TRAIN_SIZES["wmt14"] if s == "train" else 64,
                                                          name=f"wmt14_translate/{target}-en", split=s)
                                               for s in ("train", "validation", "test")}
    cifar = [{"image": b, "label": int(rng.integers(10))} for b in _encoded_images("png", 256)]
    out["cifar10"] = {s: Records(cifar, TRAIN_SIZES["cifar10"] if s == "train[:90%]" else 64, decode_image,
                                 name="cifar10", split=s) for s in ("train[:90%]", "test", "train[90%:]")}
    imagenet = [{"image": b, "label": int(rng.integers(1000))} for b in _encoded_images("jpeg", 64)]
    out["imagenet2012"] = {s: Records(imagenet, imagenet_train if s == "train" else 64, decode_image,
                                      name="imagenet2012", split=s) for s in ("train", "validation")}
    return out


def write_local_files(root: Path, corpus: Corpus) -> None:
    """The file-based sets in their documented layouts (flurka.data.local_sets, listops)."""
    from flurka.data import listops

    wiki = root / "wikitext-103-raw"
    wiki.mkdir(parents=True)
    for split, size in (("train", 2_000_000), ("valid", 200_000), ("test", 200_000)):
        (wiki / f"wiki.{split}.raw").write_bytes(corpus.data[:size])
    tsv = root / "lra_release" / "tsv_data"
    tsv.mkdir(parents=True)
    docs = corpus.pieces(2 * 256, LENGTHS["aan"], flat=True)
    rows = [f"{i % 2}\tid{i}a\tid{i}b\t{docs[2 * i].decode('utf-8', 'replace')}\t"
            f"{docs[2 * i + 1].decode('utf-8', 'replace')}\n" for i in range(256)]
    for split in ("train", "eval", "test"):
        (tsv / f"new_aan_pairs.{split}.tsv").write_text("".join(rows), encoding="utf-8")
    write_pathfinder(root / "lra_release" / "pathfinder32" / "curv_contour_length_14", 20_000)
    release = root / "lra_release" / "listops-1000"
    release.mkdir(parents=True)
    trees = listops.generate(240, **{k: listops.FULL[k] for k in ("max_depth", "max_args", "min_length",
                                                                   "max_length")}, seed=0)
    for split, part in (("train", trees[:200]), ("val", trees[200:220]), ("test", trees[220:])):
        (release / f"basic_{split}.tsv").write_text("Source\tTarget\n" + "".join(f"{s}\t{v}\n" for s, v in part))


def write_pathfinder(folder: Path, n: int, per_dir: int = 1000, unique: int = 1000) -> None:
    """``n`` random 32x32 grayscale PNGs and the metadata files naming them, as the release has them
    (``unique`` images, the rest hard links to them: each still opened and decoded on its own)."""
    from PIL import Image

    rng = np.random.default_rng(3)
    (folder / "metadata").mkdir(parents=True)
    for d in range(-(-n // per_dir)):
        (folder / "imgs" / str(d)).mkdir(parents=True)
        lines = []
        for i in range(d * per_dir, min(n, (d + 1) * per_dir)):
            path = folder / "imgs" / str(d) / f"sample_{i}.png"
            if i < unique:
                Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8)).save(path)
            else:
                os.link(folder / "imgs" / str((i % unique) // per_dir) / f"sample_{i % unique}.png", path)
            lines.append(f"imgs/{d} sample_{i}.png 0 {int(rng.integers(2))} 1 2\n")
        (folder / "metadata" / f"{d}.npy").write_text("".join(lines))


SOURCES = {
    "mlm-wikitext103": "local files: 2 MB of standard-library text as wikitext-103-raw/wiki.train.raw",
    "lra-retrieval": "local files: 256 AAN TSV rows of 2-12 kB standard-library text per document",
    "lra-pathfinder": "local files: 20k 32x32 grayscale PNGs (1k random ones, linked) and their metadata",
    "lra-listops": "local files: 200 generated ListOps trees (LRA's settings) as the release TSV",
    "imagenet": "TFDS stand-in: 500x375 JPEGs (q90, sample photos) decoded by tfds.features.Image",
    "lra-image": "TFDS stand-in: 32x32 PNGs decoded by tfds.features.Image",
    "lra-text": "TFDS stand-in: 0.4-3 kB standard-library text per review",
    "nmt-wmt14-ende": "TFDS stand-in: 40-260 B standard-library text per side",
    "nmt-wmt14-enfr": "TFDS stand-in: 40-260 B standard-library text per side",
}
for _t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"):
    SOURCES[f"glue-{_t}"] = "TFDS stand-in: 30-220 B standard-library text per sentence"


class Offline:
    """Every loader reads offline stand-ins within it: the files under ``data_dir`` (written into a
    temporary one when not given: a worker process reuses its parent's, with the vocabularies the
    loaders trained and cached there) and TFDS sources patched (the same records in every process)."""

    def __init__(self, data_dir: str | None = None, imagenet_train: int = TRAIN_SIZES["imagenet2012"]):
        self._stack = contextlib.ExitStack()
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.imagenet_train = imagenet_train

    def __enter__(self) -> Offline:
        corpus = Corpus()
        if self.data_dir is None:
            self.data_dir = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="flurka-pipeline-")))
            write_local_files(self.data_dir, corpus)
        corpus.rng = np.random.default_rng(0)   # the TFDS records drawn alike in every process
        stand_ins = tfds_stand_ins(corpus, self.imagenet_train)

        def tfds_source(name, split, data_dir=None):
            return stand_ins[name][split]

        def source_fingerprint(source):   # a stand-in's identity, for the loaders' array caches
            return {"stand-in": source.name, "split": source.split, "examples": len(source)}

        self._stack.enter_context(mock.patch("flurka.data.tfds_sets.tfds_source", tfds_source))
        self._stack.enter_context(mock.patch("flurka.data.tfds_sets.source_fingerprint", source_fingerprint))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()


def dataset_for(config, data_dir, cache: bool = True):
    """``config``'s data set by its own loader; its max_len the config's where the loader takes one;
    ``cache=False`` to a loader that caches decoded arrays: the per-example decode."""
    from flurka.data import get_dataset
    from flurka.data.registry import _BUILDERS   # the builder's signature: does it take max_len?

    module, function, _ = _BUILDERS[config.dataset]
    builder = getattr(__import__(module, fromlist=[function]), function)
    options = dict(config.dataset_options)
    params = inspect.signature(builder).parameters
    if config.task != "image" and "max_len" in params:
        options.setdefault("max_len", config.max_len)
    if not cache and "cache" in params:
        options["cache"] = False
    return get_dataset(config.dataset, seed=config.seed, data_dir=str(data_dir), **options)


# ---- the processes alternative -------------------------------------------------------------------
_WORKER: dict = {}


def _worker_init(benchmark: str, data_dir: str, cache: bool) -> None:
    from flurka.configs import get_config

    warnings.simplefilter("ignore")
    imagenet_train = CACHED_IMAGENET if cache else TRAIN_SIZES["imagenet2012"]
    offline = Offline(data_dir, imagenet_train).__enter__()   # lives as long as the worker process
    config = get_config(benchmark)
    _WORKER.update(offline=offline, dataset=dataset_for(config, offline.data_dir, cache), batch_size=config.batch_size)


def _worker_batch(step: int) -> dict:
    return _WORKER["dataset"].train_batch(step, _WORKER["batch_size"])


# ---- timing ------------------------------------------------------------------------------------------
def _timed(next_batch, budget_s: float, max_batches: int, bs: int, min_batches: int = 2) -> dict:
    """Batches taken from ``next_batch`` until ``budget_s`` passed (at least ``min_batches``): their
    count, wall and CPU seconds (this process's threads; the CPU per wall second is the parallelism
    reached, the examples per CPU second a core's rate, which other load on the host leaves alone)."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    while n < min_batches or (n < max_batches and time.perf_counter() - t0 < budget_s):
        next_batch()
        n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"batches": n, "seconds": wall, "cpu_seconds": cpu, "examples_per_s": n * bs / wall,
            "examples_per_cpu_s": n * bs / cpu if cpu > 0 else None, "cpu_per_wall": cpu / wall}


def measure(name: str, config, dataset, *, budget_s: float, processes: int | None, data_dir: Path,
            cache: bool = True, max_batches: int = 32) -> dict:
    bs = config.batch_size
    dataset.train_batch(0, bs)   # the epoch permutation, caches
    out = {}
    step = iter(range(1, 10**9))
    out["serial"] = _timed(lambda: dataset.train_batch(next(step), bs), budget_s, max_batches, bs)
    with dataset.train_batches(bs, start_step=1000, prefetch=PREFETCH) as it:
        next(it)   # the threads' start
        out["threads"] = _timed(lambda: next(it), budget_s, max_batches, bs)
    out["threads"].update(prefetch=PREFETCH, threads=default_workers(PREFETCH))
    if processes:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx, initializer=_worker_init,
                                                    initargs=(name, str(data_dir), cache)) as pool:
            list(pool.map(_worker_batch, range(2000, 2000 + processes)))   # every worker started
            steps = iter(range(3000, 10**9))
            pending = [pool.submit(_worker_batch, next(steps)) for _ in range(PREFETCH)]

            def take():
                pending.append(pool.submit(_worker_batch, next(steps)))
                return pending.pop(0).result()

            out["processes"] = _timed(take, budget_s, max_batches, bs)   # CPU: the consumer's alone
        out["processes"]["processes"] = processes
    return out


def step_floor(config, info, dataset) -> dict:
    """The fastest a step could run on each card on record: the FLOP model's training FLOPs (the
    mechanism with the fewest) at the card's measured bf16 matmul rate."""
    from flurka.catalogue.mechanisms import MECHANISMS
    from flurka.training import flops as flops_lib

    batch = dataset.train_batch(0, config.batch_size)
    shapes = {k: v.shape for k, v in batch.items() if isinstance(v, np.ndarray)}
    counts = {}
    for mech in MECHANISMS:
        try:
            counts[mech] = flops_lib.train_step_flops(config, info, shapes, attention=mech)
        except Exception:   # noqa: BLE001  (a mechanism this task's model does not take)
            continue
    fewest = min(counts, key=counts.get)
    out = {"mechanism": fewest, "train_flops": counts[fewest], "full_train_flops": counts.get("full")}
    for card, path in RECORDS.items():
        rate = json.loads(path.read_text())["ceilings"]["bfloat16"]["matmul_flops_per_s"]
        floor = counts[fewest] / rate
        out[card] = {"matmul_flops_per_s": rate, "floor_s": floor, "needed_at_floor": config.batch_size / floor}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON document to write")
    parser.add_argument("--benchmarks", default=None, help="comma-separated (default: every registered one)")
    parser.add_argument("--processes", default=",".join(DEFAULT_PROCESSES),
                        help="benchmarks also timed with worker processes ('' for none)")
    parser.add_argument("--budget-s", type=float, default=1.0, help="seconds per benchmark and mode")
    parser.add_argument("--max-batches", type=int, default=32,
                        help="at most this many batches per mode (a fast loader's 32 take milliseconds: raise it "
                             "to time those over the budget)")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="loaders that cache decoded arrays decode per example instead (cache=False)")
    args = parser.parse_args(argv)

    from flurka.configs import BENCHMARKS, get_config

    names = args.benchmarks.split(",") if args.benchmarks else list(BENCHMARKS)
    with_processes = {n for n in args.processes.split(",") if n}
    cores = os.cpu_count() or 1
    rows = []
    started = time.perf_counter()
    load_before = os.getloadavg()   # other work on the host takes CPU from the wall-clock rates
    imagenet_train = CACHED_IMAGENET if args.cache else TRAIN_SIZES["imagenet2012"]
    with Offline(imagenet_train=imagenet_train) as offline:
        for name in names:
            config = get_config(name)
            t0 = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:   # e.g. a vocabulary cut to its text
                warnings.simplefilter("always")
                dataset = dataset_for(config, offline.data_dir, args.cache)
                build_s = time.perf_counter() - t0
                dataset_for(config, offline.data_dir, args.cache)   # again: what caches give a later start
                rebuild_s = time.perf_counter() - t0 - build_s
            timed = measure(name, config, dataset, budget_s=args.budget_s,
                            processes=cores if name in with_processes else None, data_dir=offline.data_dir,
                            cache=args.cache, max_batches=args.max_batches)
            floor = step_floor(config, dataset.info, dataset)
            delivered = timed["threads"]["examples_per_s"]
            row = {"benchmark": name, "family": BENCHMARKS[name].family, "dataset": config.dataset,
                   "batch_size": config.batch_size, "max_len": dataset.info.max_len,
                   "dataset_options": dict(config.dataset_options), "vocab_size": dataset.info.vocab_size,
                   "build_warnings": sorted({str(w.message) for w in caught if w.category is not DeprecationWarning}),
                   "source": SOURCES.get(config.dataset, "ships with the package (real data)"),
                   "build_s": build_s, "rebuild_s": rebuild_s, **timed,
                   "delivered_examples_per_s": delivered,
                   "step_time_on_record": None,
                   "step_time_note": "no whole-model training step of this benchmark is in benchmarks/results/",
                   "step_floor": floor,
                   **{f"delivered_over_needed_{card}": delivered / floor[card]["needed_at_floor"] for card in RECORDS},
                   # a core's rate (CPU-time based, so the host's other load leaves it alone) against
                   # twice the need: the cores that scale linearly (processes; threads where the
                   # decoding frees the GIL) must give to feed the card 2x
                   **{f"cores_for_2x_{card}": 2 * floor[card]["needed_at_floor"] / timed["serial"]["examples_per_cpu_s"]
                      for card in RECORDS}}
            rows.append(row)
            print(f"{name:20s} bs {config.batch_size:5d}  serial {timed['serial']['examples_per_s']:9.0f} "
                  f"({timed['serial']['examples_per_cpu_s'] or 0:9.0f}/cpu-s)  threads {delivered:9.0f} "
                  f"(cpu/wall {timed['threads']['cpu_per_wall']:.2f})"
                  + (f"  processes {timed['processes']['examples_per_s']:10.0f}" if "processes" in timed else "")
                  + f"  needed@floor H100 {floor['h100']['needed_at_floor']:10.0f} ex/s  "
                  f"({row['delivered_over_needed_h100']:.2f}x)", flush=True)
    # here, not at the top: the worker processes this file spawns import it, and need no JAX
    from flurka.speed.runner import device_info, host_info, versions

    doc = {"schema": SCHEMA, "sweep": "input-pipeline",
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": {**device_info(), **host_info()}, "versions": versions(extra=("pillow", "tensorflow-datasets", "scikit-learn")),
           "settings": {"prefetch": PREFETCH, "budget_s": args.budget_s, "processes": sorted(with_processes),
                        "cache": args.cache, "max_batches": args.max_batches, "imagenet_train_images": imagenet_train,
                        "records": {card: str(path.relative_to(ROOT.parent)) for card, path in RECORDS.items()},
                        "wall_s": time.perf_counter() - started,
                        "load_average_before_after": [load_before[0], os.getloadavg()[0]]},
           "ceilings": {card: json.loads(path.read_text())["ceilings"] for card, path in RECORDS.items()},
           "results": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wrote {args.out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
