"""Pre-trained at N, fine-tuned at n < N (issue 57: WikiText-103 at 512, GLUE at 128): Linformer's
E1/E2 are cut to their first n columns, which is the pre-trained layer itself on the input
zero-padded to N with the padding masked — checked in float64 against the independent NumPy
reference (tests/support/attention_reference.py) — and through ``flurka.training.run``. flurka-eva,
whose windows are rows in proportion to E's length, and a d_k that differs are refused in one line."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_reference import D_MODEL, HEADS, f64, inputs, randomize, reference
from flax import nnx
from training_helpers import tiny

from flurka.attention import make_attention
from flurka.training import run
from flurka.training.checkpoints import Checkpointer
from flurka.training.init_from import TRUNK, with_trunk
from flurka.training.state import by_path

LONG, SHORT, D_K = 24, 10, 8     # pre-trained length N, fine-tuning length n, compressed rows
PREFIX = "encoder/layers/0/attention/"


def _layer(mechanism, max_len, seed, **options):
    opts = dict(d_k=D_K, num_features=16, **options)
    if mechanism == "flurka-eva":
        opts.update(window_size=9, chunk_size=6)
    return make_attention(mechanism, d_model=D_MODEL, num_heads=HEADS, max_len=max_len, rngs=nnx.Rngs(seed), **opts)


def _to_f64(layer):
    """Every variable in float64 (the values are float32 ones, so the reference's float32 reads are exact)."""
    state = nnx.state(layer, nnx.Not(nnx.RngState))
    nnx.update(layer, jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), state))
    return layer


def _params(layer) -> dict[str, np.ndarray]:
    return {PREFIX + k: np.asarray(v) for k, v in by_path(nnx.state(layer, nnx.Param)).items()}


def _load(layer, params: dict[str, np.ndarray]) -> None:
    state = nnx.state(layer, nnx.Param)
    names = list(by_path(state))
    leaves = [jnp.asarray(params[PREFIX + n]) for n in names]
    nnx.update(layer, jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), leaves))


def _pretrained_and_cut(mechanism, e_init, sharing, keep_pool_e):
    """(the layer pre-trained at LONG, the same layer loaded at SHORT through ``with_trunk``)."""
    pre = randomize(_layer(mechanism, LONG, 0, e_init=e_init, sharing=sharing, dtype=jnp.float64), 7)
    if keep_pool_e:     # pooled E as drawn: rows with no column among the first SHORT positions
        fresh = _layer(mechanism, LONG, 0, e_init=e_init, sharing=sharing)
        pre.seq_proj.e1[...] = fresh.seq_proj.e1[...]
        if pre.seq_proj.e2 is not None:
            pre.seq_proj.e2[...] = fresh.seq_proj.e2[...]
    short = _layer(mechanism, SHORT, 1, e_init=e_init, sharing=sharing, dtype=jnp.float64)
    loaded, new = with_trunk(_params(short), _params(pre), "pre")
    assert new == []
    _load(short, loaded)
    for name in ("features", "noise"):    # the random draws are a run's own (not parameters): the same here
        if hasattr(pre, name):
            getattr(short, name)[...] = getattr(pre, name)[...][: getattr(short, name)[...].shape[0]]
    return pre, short


def _padded(x, mask):
    pad = LONG - x.shape[1]
    return jnp.pad(x, ((0, 0), (0, pad), (0, 0))), jnp.pad(mask, ((0, 0), (0, pad)))


@pytest.mark.parametrize("mechanism,e_init,sharing,keep_pool_e", [
    ("linformer", "gaussian", "headwise", False),
    ("linformer", "pool", "headwise", True),       # zero rows of E over the first n: masked alike
    ("flurka-performer", "pool", "kv", False),
    ("flurka-rnn", "gaussian", "none", False),     # per-head E [H, d_k, N]
    ("flurka-rnn", "pool", "headwise", True),
])
def test_the_cut_layer_is_the_pretrained_one_on_the_padded_input(mechanism, e_init, sharing, keep_pool_e):
    with jax.enable_x64(True):
        pre, short = (_to_f64(m) for m in _pretrained_and_cut(mechanism, e_init, sharing, keep_pool_e))
        e1 = np.asarray(pre.seq_proj.e1[...])
        np.testing.assert_array_equal(np.asarray(short.seq_proj.e1[...]), e1[..., :SHORT])
        if keep_pool_e:
            assert (np.abs(e1[..., :SHORT]).sum(-1) == 0).any()   # some compressed rows see no short position
        x, mask = inputs(3, batch=3, seq=SHORT)
        xp, mp = _padded(x, mask)
        want = reference(pre, xp, mp)[:, :SHORT]     # float64 formulas over N positions, padding dropped
        exact = reference(short, x, mask)             # the same formulas, the cut layer at n positions
        x64, xp64 = (jnp.asarray(a, jnp.float64) for a in (x, xp))
        cut = np.asarray(short(x64, mask))
        padded = np.asarray(pre(xp64, mp))[:, :SHORT]
    real = np.asarray(mask)
    scale = np.abs(want[real]).max()
    # the property, in float64: the cut parameters at n are the pre-trained layer on the padded input
    assert np.abs(exact[real] - want[real]).max() <= 1e-12 * scale
    # and our layer computes it, both ways (its softmax, feature maps and sums run in float32 by design)
    assert np.abs(cut[real] - want[real]).max() <= 1e-5 * scale
    assert np.abs(padded[real] - want[real]).max() <= 1e-5 * scale
    assert np.abs(cut[real] - padded[real]).max() <= 1e-6 * scale


def test_flurka_eva_is_refused_and_its_cut_would_be_another_function():
    pre = randomize(_layer("flurka-eva", LONG, 0), 7)
    short = _layer("flurka-eva", SHORT, 1)
    with pytest.raises(ValueError) as info:
        with_trunk(_params(short), _params(pre), "pre")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--init-from pre: {PREFIX}seq_proj/e1 is flurka-eva's E")
    assert f"fine-tune flurka-eva at the pre-training's length {LONG}" in message
    # why: cut anyway, the layer is not the pre-trained one on the padded input
    cut = {k: (v[..., :SHORT] if k.endswith(("/e1", "/e2")) else v) for k, v in _params(pre).items()}
    _load(short, cut)
    x, mask = inputs(3, batch=3, seq=SHORT)
    xp, mp = _padded(x, mask)
    want = reference(pre, xp, mp)[:, :SHORT]
    real = np.asarray(mask)
    for got in (reference(short, x, mask), f64(short(x, mask))):
        assert np.abs(got[real] - want[real]).max() > 1e-2 * np.abs(want[real]).max()


def test_another_d_k_is_refused_in_one_line():
    pre = randomize(_layer("linformer", LONG, 0), 7)
    short = make_attention("linformer", d_model=D_MODEL, num_heads=HEADS, max_len=SHORT, d_k=4, rngs=nnx.Rngs(1))
    with pytest.raises(ValueError) as info:
        with_trunk(_params(short), _params(pre), "pre")
    message = str(info.value)
    assert "\n" not in message
    assert message == (f"--init-from pre: {PREFIX}seq_proj/e1 compresses to {D_K} rows (d_k) there but 4 here; "
                       f"cutting E to this run's length keeps its positions, not its rows: fine-tune with "
                       f"d_k={D_K}, or pre-train with d_k=4")


def _checkpoint_params(workdir) -> dict[str, np.ndarray]:
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        state, _ = ckpt.restore_saved(ckpt.latest_step())
    return {k: np.asarray(v) for k, v in by_path(state["params"]).items()}


def _mlm(n: int, **overrides):
    data = {"max_len": n, "max_train_bytes": 20_000, "max_eval_bytes": 4_000}
    return tiny("mlm-small", max_len=n, dataset_options=data, **overrides, model=dict(attention="flurka-rnn"))


def test_run_loads_a_flurka_rnn_trunk_pretrained_longer(tmp_path):
    """``flurka.training.run`` with ``init_from`` a flurka-rnn MLM run at 32 tokens, fine-tuned at
    16: its first checkpoint (after one step at lr 1e-30) holds the pre-trained trunk, E and the
    position table cut to their first 16 columns and rows, every other trunk parameter equal."""
    run(_mlm(32, steps=2, workdir=str(tmp_path / "pre"), checkpoint_every=2, seed=3))
    result = run(_mlm(16, steps=1, learning_rate=1e-30, warmup_steps=0, checkpoint_every=1,
                      init_from=str(tmp_path / "pre"), workdir=str(tmp_path / "tuned")))
    source, tuned = _checkpoint_params(tmp_path / "pre"), _checkpoint_params(tmp_path / "tuned")
    trunk = [k for k in tuned if k.startswith(TRUNK)]
    cut = [k for k in trunk if k.endswith(("/seq_proj/e1", "/seq_proj/e2")) or k == "embedding/position"]
    assert len(cut) == 1 + 2 and result["init_from"]["copied"] == len(trunk)
    for k in trunk:
        want = source[k]
        if k in cut:
            assert want.shape[-1 if k != "embedding/position" else 0] == 32, k
            want = want[:16] if k == "embedding/position" else want[..., :16]
        np.testing.assert_allclose(tuned[k], want, rtol=0, atol=1e-28, err_msg=k)
