"""What a sweep's plan will cost, predicted before anything starts (``flurka sweep --dry-run``).

**FLOPs.** Each planned trial's training FLOPs are the FLOP model's, counted as the training loop
counts the ``train_flops`` it reports: :func:`flurka.training.flops.train_step_flops` at the
trial's config (the runner's overrides: mechanism, d_k, α and base, on the sweep's ``--set``) and
its batch's shapes, stage by stage of :func:`flurka.training.uptrain.stages` (base, hand-over,
variant), over the steps the trial executes (a branch from its fork, a separate base up to its
last fork). A shipped data set is built (in memory, as a run builds it) for its info and batch
shapes; a paper-scale one, whose data is not here, is laid out from its config as its loader
lays it out (:func:`batch_layout`).

**Time.** No training step of a benchmark's model is on record, so time is an estimate: the FLOPs
at an effective rate read, when the dry run runs, from the speed harness's documents
(``flurka.speed/1`` JSON, :mod:`flurka.speed`) under ``benchmarks/results/`` of this checkout or
``--step-times FILE|DIR``; per-card figures live there and in its ``NOTES.md``, never here. Per
card (a GPU named by the documents) and benchmark:

* the **estimate** divides by the achieved rate (the model's FLOPs / the median step time) of the
  training steps on record nearest the trial: the same compute dtype (the card's float32 and
  bfloat16 rates differ ~1.5×), then the nearest d_model (GEMM efficiency depends on it most),
  a whole encoder stack before a lone layer, the fewest fused kernels (the loop runs XLA's own
  path), unpadded, the newest document; the median over that group's mechanisms. Softmax
  attention (full, flash) is left out of the rates: its rate on record, at N = 52.5k, is that of
  its N² products, which the benchmarks' lengths do not have;
* the **floor** divides by the card's best measured bf16 GEMM rate (``ceilings``): no step runs
  faster, whatever its dtype.

Left out of both: evaluation (eval batches, BLEU decoding), what the FLOP model does not count
(embeddings, LayerNorms, the optimizer update, rematerialisation's recomputed forward), data
loading and compilation. Wall time deals each Tune experiment's trials (first the runs branches
fork from, then the branches: :meth:`flurka.sweeps.branching.Plan.phases`), longest first, to
``--gpus`` cards, one trial per ``max(1, gpus_per_trial)`` of them (a multi-card trial assumed to
scale perfectly, trials sharing a card sharing its rate).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from flurka import configs
from flurka.sweeps.branching import Plan, PlannedRun
from flurka.sweeps.spec import SweepSpec, benchmarks_of, phase_spec

SPEED_SCHEMA = "flurka.speed/1"
SOFTMAX = ("full", "flash")          # left out of the rates (module docstring)
DEFAULT_GPUS = 8                      # the cards the wall time assumes without --gpus (one 8-GPU node)
NO_RECORDS = "no step times on record"

# The paper-scale loaders' layout where their config does not say it (flurka.data.tfds_sets,
# local_sets, listops: the classes each DatasetInfo is built with; ImageNet's 224 crops). The test
# checks the layouts against the input-pipeline benchmark's record of the real loaders' batches.
_CLASSES = {"lra-listops": 10, "lra-text": 2, "lra-retrieval": 2, "lra-image": 10, "lra-pathfinder": 2,
            "imagenet": 1000}
_TWO_TOWER = ("lra-retrieval",)
_IMAGE_SHAPE = {"imagenet": (224, 224, 3)}


# ---- FLOPs of a planned trial -------------------------------------------------------------------
def trial_config(run: PlannedRun, sweep: SweepSpec):
    """The trial's TrainConfig as far as FLOPs go: the runner's overrides (``trainable.
    train_overrides``: its phase's, :meth:`PlannedRun.overrides`) but its workdir, checkpoints and
    ``init_from``, which count none."""
    spec = phase_spec(sweep, run.benchmark)
    return configs.get_config(run.benchmark, **run.overrides(spec.config_overrides, spec.steps))


def batch_layout(config) -> tuple[Any, dict[str, tuple[int, ...]]]:
    """``(info, shapes)``: the DatasetInfo and a training batch's array shapes the FLOP count
    reads. A data set that ships is built as the loop builds it (``loop.load_dataset``); a
    paper-scale one is laid out from its config: ``max_len`` tokens a side (the loop refuses any
    other), the vocabulary its ``dataset_options`` name (bytes, a SentencePiece model file, or the
    one the loader trains: ``vocab_size`` or 32k pieces), the classes its loader sets."""
    from flurka.data import SMALL_DATASETS
    from flurka.data.core import DatasetInfo

    if config.dataset in SMALL_DATASETS:
        import numpy as np

        from flurka.data import get_dataset

        dataset = get_dataset(config.dataset, seed=config.seed, data_dir=config.data_dir,
                              **dict(config.dataset_options))
        batch = dataset.train_batch(0, config.batch_size)
        return dataset.info, {k: tuple(v.shape) for k, v in batch.items() if isinstance(v, np.ndarray)}
    b, n, task, name = config.batch_size, config.max_len, config.task, config.dataset
    if task == "image":
        shape = _IMAGE_SHAPE[name]
        info = DatasetInfo(name=name, task=task, vocab_size=0, max_len=0, num_classes=_CLASSES[name],
                           image_shape=shape)
        return info, {"image": (b, *shape)}
    if task in ("translation", "mlm"):
        v = _vocab_size(config)
        info = DatasetInfo(name=name, task=task, vocab_size=v, max_len=n, num_classes=v if task == "mlm" else 0,
                           target_vocab_size=v if task == "translation" else 0,
                           target_max_len=n if task == "translation" else 0)
        return info, {"inputs": (b, n), **({"targets": (b, n)} if task == "translation" else {})}
    if name.startswith("glue-"):
        from flurka.configs.glue import TASKS

        classes = TASKS[name.removeprefix("glue-")][1]
    elif name in _CLASSES:
        classes = _CLASSES[name]
    else:
        raise ValueError(f"no batch layout for data set {name!r} without building it")
    towers = name in _TWO_TOWER
    info = DatasetInfo(name=name, task=task, vocab_size=0, max_len=n, num_classes=classes,
                       pair="two-tower" if towers else None)
    return info, {"inputs": (b, n), **({"inputs2": (b, n)} if towers else {})}


def _vocab_size(config) -> int:
    from flurka.data.subword import DEFAULT_VOCAB_SIZE
    from flurka.data.tokenizers import BYTES, SentencePieceTokenizer

    opts = dict(config.dataset_options)
    vocab = opts.get("vocab", "bytes")
    if vocab == "bytes":
        return BYTES.vocab_size
    if vocab == "sentencepiece":
        return int(opts.get("vocab_size") or DEFAULT_VOCAB_SIZE)
    return SentencePieceTokenizer.load(vocab).vocab_size


def trial_flops(run: PlannedRun, config, info, shapes) -> int:
    """Training FLOPs of the steps ``run`` executes, ``[start_step, stop_step)``, each at its
    stage's count: what the loop adds to ``train_flops`` over them."""
    from flurka.training import flops as flops_lib
    from flurka.training import uptrain

    stop = run.stop_step if run.stop_step is not None else run.steps
    total = 0
    for stage in uptrain.stages(config):
        steps = min(stage.end, stop) - max(stage.first, run.start_step)
        if steps > 0:
            total += steps * flops_lib.train_step_flops(config, info, shapes, attention=stage.attention,
                                                        handover_from=stage.handover_from)
    return total


def plan_flops(sweep: SweepSpec, plan: Plan) -> dict[str, int]:
    """Training FLOPs of every planned trial, by its key (one data set built per benchmark)."""
    layouts: dict[str, tuple] = {}
    out: dict[str, int] = {}
    for run in plan.runs:
        config = trial_config(run, sweep)
        layout = (run.benchmark, run.max_len)    # a run fine-tuned at the pre-training's length: its own
        if layout not in layouts:
            layouts[layout] = batch_layout(config)
        out[run.key] = trial_flops(run, config, *layouts[layout])
    return out


# ---- rates on record ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Rate:
    """One card's rates for one benchmark: ``flops_per_s`` (the estimate's, None when no training
    step in the dtype is on record) and ``ceiling`` (the floor's, None without a GEMM ceiling)."""

    card: str
    flops_per_s: float | None
    source: str
    ceiling: float | None
    ceiling_source: str
    other: str = ""       # where no step of the dtype is: the dtypes that are on record

    def seconds(self, flops: float) -> tuple[float, bool]:
        """(seconds, estimated): the estimate where a rate is on record, else the floor."""
        if self.flops_per_s:
            return flops / self.flops_per_s, True
        return flops / self.ceiling, False


def repository_results() -> Path | None:
    """``benchmarks/results`` of the checkout this module runs from; None in an installed wheel."""
    root = Path(__file__).resolve().parents[3]
    results = root / "benchmarks" / "results"
    return results if (root / "pyproject.toml").is_file() and results.is_dir() else None


def load_records(step_times: str | os.PathLike | None = None) -> tuple[list[tuple[str, dict]], str]:
    """``([(shown path, document), ...], where)``: the GPU speed documents of ``step_times`` (a file
    or a folder, searched recursively), else of the checkout's ``benchmarks/results``."""
    if step_times is not None:
        root = Path(step_times).expanduser()
        base = root.parent
        where = str(step_times)
    else:
        root = repository_results()
        if root is None:
            return [], "no benchmarks/results/ here (an installed package): give --step-times FILE|DIR"
        base, where = root.parents[1], "benchmarks/results/"
    if not root.exists():
        return [], f"{where} does not exist"
    files = [root] if root.is_file() else sorted(root.rglob("*.json"))
    docs = []
    for path in files:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("schema") == SPEED_SCHEMA and (doc.get("device") or {}).get("platform") == "gpu":
            docs.append((os.path.relpath(path, base), doc))
    return docs, where if docs else f"{where} holds none"


def card_label(device_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``; the whole name where no model number shows."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", device_name)
    return m.group(1) if m else device_name


def _fused(r: dict) -> int:
    return sum(bool(r.get(k)) for k in ("fused", "fused_ffn", "fused_projections"))


def _padded(r: dict) -> bool:
    return (r.get("align") or 1) > 1 or (r.get("pad_to") or 1) > 1


def card_rates(docs: Sequence[tuple[str, dict]], *, d_model: int, dtype: str) -> list[Rate]:
    """Each card's :class:`Rate` for a model of ``d_model`` trained in ``dtype`` (module docstring)."""
    by_card: dict[str, list[tuple[str, dict]]] = {}
    for path, doc in docs:
        by_card.setdefault(doc["device"]["name"], []).append((path, doc))
    rates = []
    for card, mine in sorted(by_card.items(), key=lambda kv: card_label(kv[0])):
        ceilings = [(doc["ceilings"]["bfloat16"]["matmul_flops_per_s"], path) for path, doc in mine
                    if ((doc.get("ceilings") or {}).get("bfloat16") or {}).get("matmul_flops_per_s")]
        ceiling, ceiling_path = max(ceilings) if ceilings else (None, "")
        groups: dict[tuple, list[dict]] = {}
        created: dict[tuple, str] = {}
        for path, doc in mine:
            for r in doc.get("results") or ():
                if (r.get("status") == "ok" and r.get("mode") == "train" and r.get("dtype") == dtype
                        and r.get("mechanism") not in SOFTMAX and r.get("flops") and r.get("median_s")):
                    key = (path, r.get("scope"), r.get("seq_len"), r.get("d_model"), r.get("num_heads"),
                           r.get("layers"), r.get("ffn"), r.get("batch"), r.get("align"), r.get("pad_to"),
                           bool(r.get("fused")), bool(r.get("fused_ffn")), bool(r.get("fused_projections")))
                    groups.setdefault(key, []).append(r)
                    created[key] = str(doc.get("created") or "")
        if not groups and ceiling is None:
            continue
        if not groups:
            others = sorted({r.get("dtype") for _, doc in mine for r in doc.get("results") or ()
                             if r.get("status") == "ok" and r.get("mode") == "train" and r.get("dtype")})
            other = "".join(f" (--set compute_dtype={d} predicts from its {d} ones)" for d in others[:1])
            rates.append(Rate(card, None, f"no {dtype} training step on record", ceiling, ceiling_path, other))
            continue
        newest_first = sorted(groups, key=lambda k: created[k], reverse=True)
        best = min(newest_first, key=lambda k: (abs(math.log(k[3] / d_model)), k[1] != "model",
                                                _fused(groups[k][0]), _padded(groups[k][0])))
        group = groups[best]
        rate = statistics.median(r["flops"] / r["median_s"] for r in group)
        r0 = group[0]
        what = (f"a {r0.get('layers')}-layer encoder stack" if r0.get("scope") == "model" else "one attention layer")
        fused = [w for k, w in (("fused", "fused query side"), ("fused_ffn", "fused FFN"),
                                ("fused_projections", "fused projections")) if r0.get(k)]
        source = (f"the median of the {dtype} training steps of {', '.join(r['mechanism'] for r in group)} on "
                  f"record ({what}, d_model {r0['d_model']}, batch {r0['batch']}, N = {r0['seq_len']:,}"
                  f"{', ' + ', '.join(fused) if fused else ''}: {best[0]})")
        if max(r0["d_model"], d_model) / min(r0["d_model"], d_model) > 1.5:
            source += f"; the model's d_model is {d_model}: a rough estimate" + (
                " (a smaller model's steps are bound by launches more than by FLOPs)" if d_model < r0["d_model"] else "")
        rates.append(Rate(card, rate, source, ceiling, ceiling_path))
    return rates


# ---- the dry run's lines ------------------------------------------------------------------------
def _makespan(times: Iterable[float], workers: int) -> float:
    """Longest first to the least loaded of ``workers`` queues (how Tune fills free workers)."""
    queues = [0.0] * max(1, workers)
    for t in sorted(times, reverse=True):
        queues[queues.index(min(queues))] += t
    return max(queues)


def _hours(seconds: float) -> str:
    h = seconds / 3600
    if h >= 0.1:
        return f"{h:,.0f} h" if h >= 100 else f"{h:.3g} h"
    return f"{seconds / 60:.2g} min" if seconds >= 60 else f"{seconds:.2g} s"


def _flops(x: float) -> str:
    mantissa, exponent = f"{x:.3e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _trial_words(run: PlannedRun) -> str:
    words = f"{run.kind} {run.attention}" + (f" d_k {run.d_k}" if run.d_k is not None else "")
    if run.kind == "branch":
        words += f", α {run.alpha:g} from {run.base}" + (f" (forked at {run.start_step:,})" if run.base_key else "")
    return words


def _eval_words(config) -> str:
    if not config.eval_every:
        evals = "an evaluation at the end"
    else:
        evals = f"an evaluation every {config.eval_every:,} steps and at the end"
    words = f"{evals} ({f'{config.eval_batches} batches' if config.eval_batches else 'the whole eval split'}"
    if config.task == "translation":
        words += f"; {config.bleu_batches} decoded for BLEU at beam {config.beam_size}"
    return words + ")"


def forecast_lines(sweep: SweepSpec, plan: Plan, *, step_times: str | os.PathLike | None = None,
                   gpus: int | None = None) -> list[str]:
    """The dry run's prediction: per trial (trials that differ only in their seed on one line) its
    FLOPs and hours per card, then per card the GPU-hours and the wall time on ``gpus`` cards (a
    chained sweep's: also per phase, pre-training then fine-tuning)."""
    runs = plan.runs
    benchmarks = benchmarks_of(sweep)
    flops = plan_flops(sweep, plan)
    docs, where = load_records(step_times)
    gpus = DEFAULT_GPUS if gpus is None else gpus
    lines = ["predicted: the FLOP model's training FLOPs per trial (what `flurka train` reports as train_flops), "
             "training steps only"]
    if not docs:
        lines.append(f"{NO_RECORDS} ({where}): FLOPs only")
    rates: dict[str, list[Rate]] = {}
    for benchmark in benchmarks:
        mine = [r for r in runs if r.benchmark == benchmark]
        config = trial_config(mine[0], sweep)
        rates[benchmark] = card_rates(docs, d_model=config.model.d_model, dtype=config.compute_dtype) if docs else []
        note = "; rematerialisation's recomputed forward not counted" if config.model.remat else ""
        lines.append(f"  {benchmark} ({config.compute_dtype}): {_flops(sum(flops[r.key] for r in mine))} FLOPs; "
                     f"evaluation not included: {_eval_words(config)}{note}")
        rows: dict[tuple, list[PlannedRun]] = {}
        for run in mine:
            rows.setdefault((_trial_words(run), run.executed_steps, flops[run.key]), []).append(run)
        for (words, steps, f), same in rows.items():
            times = [(rate, *rate.seconds(f)) for rate in rates[benchmark]]
            cards = "".join(f", {card_label(rate.card)} {'≈' if est else '≥'} {_hours(s)}" for rate, s, est in times)
            lines.append(f"    {words} ×{len(same)}: {steps:,} steps, {_flops(f)} FLOPs{cards}")
    sources: dict[str, list[str]] = {}
    for benchmark in benchmarks:
        for rate in rates[benchmark]:
            label = card_label(rate.card)
            if rate.flops_per_s:
                text = f"{label} at {rate.flops_per_s / 1e12:.1f} TFLOP/s: {rate.source}"
            else:
                text = (f"{label}: {rate.source}{rate.other}; floor only, at its best bf16 GEMM rate "
                        f"{rate.ceiling / 1e12:.0f} TFLOP/s ({rate.ceiling_source})")
            sources.setdefault(text, []).append(benchmark)
    for text, named in sources.items():
        scope = "" if len(named) == len(benchmarks) else f" [{', '.join(named)}]"
        lines.append(f"  rate, {text}{scope}")
    total = sum(flops.values())
    lines.append(f"in all: {_flops(total)} training FLOPs (evaluation not included)")
    if not docs:
        return lines
    share = max(1.0, float(sweep.gpus_per_trial))
    workers = max(1, int(gpus / share + 1e-9))
    stages = plan.stages(baselines_beside_branches=sweep.search == "grid" and sweep.scheduler == "none",
                         workers=workers)
    cards = sorted({rate.card for rs in rates.values() for rate in rs}, key=card_label)
    for card in cards:
        of = {b: next((r for r in rates[b] if r.card == card), None) for b in benchmarks}
        if any(rate is None for rate in of.values()):
            continue

        def seconds(run: PlannedRun, floor: bool = False) -> float:
            rate = of[run.benchmark]
            return flops[run.key] / (rate.ceiling if floor else rate.flops_per_s)

        estimated = all(rate.flops_per_s for rate in of.values())
        parts = []
        for floor in ((False, True) if estimated else (True,)):
            if floor and not all(rate.ceiling for rate in of.values()):
                continue
            sign = "≥" if floor else "≈"

            def cost(stage_names, runs=runs, floor=floor, sign=sign) -> str:
                gpu_s = sum(seconds(r, floor) for r in runs)
                wall = sum(_makespan((seconds(r, floor) / share for r in phase), workers)
                           for name, phase in stages if name in stage_names)
                return (f"{sign} {_hours(gpu_s).replace(' h', ' GPU-h')}, "
                        f"{sign} {_hours(wall)} wall on {gpus} card{'s' if gpus != 1 else ''}")

            text = cost([name for name, _ in stages])
            if plan.pretrain is not None:
                pre = {r.key for r in plan.pretrain.runs}
                text += (f" (pre-training {cost(('pretrain', 'pretrain-branches'), [r for r in runs if r.key in pre])}; "
                         f"fine-tuning {cost(('first', 'branches'), [r for r in runs if r.key not in pre])})")
            parts.append(f"{'floor ' if floor and estimated else ''}{text}")
        if parts:
            lines.append(f"  {card_label(card)} ({card}): " + "; ".join(parts))
    lines.append(f"  assumption: no training step of these models is on record ({where}): ≈ is an estimate, the "
                 f"model at the rate of the nearest training step on record; ≥ a floor, its FLOPs at the card's "
                 f"bf16 GEMM ceiling; {'one card' if share == 1 else f'{share:g} cards'} a trial, the branches after "
                 f"the runs they fork from (--gpus N)")
    return lines


__all__ = ["Rate", "trial_config", "batch_layout", "trial_flops", "plan_flops", "load_records", "card_rates",
           "card_label", "repository_results", "forecast_lines", "NO_RECORDS", "DEFAULT_GPUS"]
