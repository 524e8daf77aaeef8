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


def test_each_kernel_module_imports_first_and_sits_below_the_layers():
    """flurka.kernels (issue 56): every kernel module imports on its own in a fresh interpreter
    (the attention layers import the kernels, and the kernels the layers' shared pieces), and
    the kernels import nothing from the models, training or speed rooms."""
    import subprocess
    import sys

    mods = flurka_modules()
    kernels = sorted(m for m in mods if m.startswith("flurka.kernels."))
    assert {f"flurka.kernels.{m}" for m in ("query_side", "compress", "projected_layer", "ffn")
            } <= set(kernels)
    rooms_above = ("flurka.models", "flurka.training", "flurka.speed", "flurka.theory")
    for name in kernels:
        above = {m for m in imports_of(name, mods[name], mods) if m.startswith(rooms_above)}
        assert not above, f"{name} imports {sorted(above)}"
    code = ("import importlib, sys\n"
            f"for name in {kernels!r}:\n"
            "    for m in [m for m in sys.modules if m.startswith('flurka')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n")
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
