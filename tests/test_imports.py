"""No module imports itself through others (issue 42): the import graph of every flurka module,
module-level and function-level imports alike, has no cycle. ``from pkg import sub`` counts as
importing the submodule ``pkg.sub``; a name from ``pkg`` itself counts as importing ``pkg``."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("workers", "platform", "dashboards")


def flurka_modules() -> dict[str, Path]:
    mods = {}
    for folder in FOLDERS:
        for path in (ROOT / folder / "flurka").rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def imports_of(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(node.module)
    return {m for m in out if m in mods and m != name}


def test_the_import_graph_has_no_cycle():
    mods = flurka_modules()
    assert {"flurka.theory", "flurka.theory.cli", "flurka.speed.runner", "flurka.sweeps.runner"} <= set(mods)
    graph = {name: imports_of(name, path, mods) for name, path in mods.items()}
    assert "flurka.theory" in graph["flurka.theory.trained"]      # edges are found at all
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None


def test_each_kernel_module_imports_first_and_sits_above_the_layers():
    """flurka.kernels (issue 56): every kernel module imports on its own in a fresh interpreter;
    the kernels import the attention room, never the models, training or speed rooms, and nothing
    in the attention or models rooms imports a kernel (the kernels register themselves)."""
    import subprocess
    import sys

    mods = flurka_modules()
    kernels = sorted(m for m in mods if m.startswith("flurka.kernels."))
    assert {f"flurka.kernels.{m}" for m in ("query_side", "compress", "projected_layer", "ffn", "joint_softmax")
            } <= set(kernels)
    rooms_above = ("flurka.models", "flurka.training", "flurka.speed", "flurka.theory")
    for name in kernels:
        above = {m for m in imports_of(name, mods[name], mods) if m.startswith(rooms_above)}
        assert not above, f"{name} imports {sorted(above)}"
    for name in (m for m in mods if m.startswith(("flurka.attention", "flurka.models"))):
        below = {m for m in imports_of(name, mods[name], mods) if m.startswith("flurka.kernels")}
        assert not below, f"{name} imports {sorted(below)}"
    code = ("import importlib, sys\n"
            f"for name in {kernels!r}:\n"
            "    for m in [m for m in sys.modules if m.startswith('flurka')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_fused_option_without_the_kernels_loaded_says_so_then_works_once_they_are():
    """The layers and the model build without flurka.kernels; an option that runs a kernel asks
    for it in one line at construction; a training config that asks for one loads them, and
    importing flurka.kernels (as flurka.speed does) registers every entry the options call."""
    import subprocess
    import sys

    code = """
import sys
from flax import nnx
import flurka.attention, flurka.models, flurka.training.loop
from flurka.attention import make_attention
from flurka.configs.model import ModelConfig
from flurka.models.encoder import EncoderBlock
assert not [m for m in sys.modules if m.startswith('flurka.kernels')], 'kernels imported by the layers'
kw = dict(d_model=128, num_heads=2, max_len=16, rngs=nnx.Rngs(0))
for build in (lambda: make_attention('performer', fused=True, **kw),
              lambda: make_attention('eva', fused=True, **kw),
              lambda: EncoderBlock(ModelConfig('full', d_model=128, num_heads=2, d_ff=256, fused_ffn=True),
                                   max_len=16, rngs=nnx.Rngs(0))):
    try:
        build()
    except ValueError as err:
        assert 'runs Pallas kernels, which are not loaded: import flurka.kernels first' in str(err), err
        assert '\\n' not in str(err)
    else:
        raise AssertionError('built without the kernels')
make_attention('performer', **kw)   # the XLA path needs none
from flurka.configs import get_config
from flurka.data.core import DatasetInfo
from flurka.training.loop import build_model
config = get_config('lra-listops-small').replace(model={'attention_options': {'fused': True}})
info = DatasetInfo(name='t', task='classification', vocab_size=20, max_len=config.max_len, num_classes=10)
build_model(config, info, 'performer')   # a training config that asks for a kernel loads them
assert 'flurka.kernels' in sys.modules
import flurka.kernels
from flurka.kernels.query_side import Tiling
assert make_attention('performer', fused=True, **kw).fused == Tiling()
assert make_attention('rnn', fused=True, fused_projections=True, **kw).fused_projections
EncoderBlock(ModelConfig('full', d_model=128, num_heads=2, d_ff=256, fused_ffn=True), max_len=16, rngs=nnx.Rngs(0))
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_the_mechanism_names_are_plain_python_and_the_layers_use_them():
    """flurka.catalogue.mechanisms names every mechanism once, without JAX (a database reader or a sweep's
    driver imports it); the attention package has a layer class per name, in that order."""
    import subprocess
    import sys

    code = ("import sys, flurka.catalogue.mechanisms as m, flurka.results.records as r; "
            "assert 'jax' not in sys.modules, 'jax'; assert r.MECHANISMS is m.MECHANISMS")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    from flurka import attention
    from flurka.catalogue import mechanisms
    from flurka.attention import flops

    assert attention.MECHANISMS == flops.MECHANISMS == mechanisms.MECHANISMS
    assert set(mechanisms.COMPRESSED) | {"full", "flash", *mechanisms.KERNELS} == set(mechanisms.MECHANISMS)
    assert {v: mechanisms.constituents(v) for v in mechanisms.FLURKA} == {
        f"flurka-{k}": {"low_rank": "linformer", "kernel": k} for k in ("performer", "rnn", "eva")}


def test_a_training_config_with_the_fused_ffn_loads_the_kernels():
    """``model.fused_ffn`` (a ModelConfig field a config may set) runs the FFN kernels: building the
    model from such a config loads them, as the attention's ``fused`` options do."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from flurka.configs import get_config\n"
            "from flurka.data.core import DatasetInfo\n"
            "from flurka.training.loop import build_model\n"
            "config = get_config('lra-listops-small', **{'model.fused_ffn': True, 'model.d_model': 128, "
            "'model.d_ff': 256})\n"
            "info = DatasetInfo(name='t', task='classification', vocab_size=20, max_len=config.max_len, num_classes=10)\n"
            "assert 'flurka.kernels' not in sys.modules\n"
            "model = build_model(config, info, 'full')\n"
            "assert 'flurka.kernels' in sys.modules and model.encoder.layers[0].ffn_tiling is not None\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
