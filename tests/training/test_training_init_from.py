"""Pre-train then fine-tune (issue 57): ``init_from`` loads exactly another run's embedding and
encoder, draws the task head afresh, records where it came from, and refuses in one line a
checkpoint of another architecture."""

import os

import numpy as np
import pytest
from training_helpers import tiny

from flurka.training import run
from flurka.training.checkpoints import Checkpointer
from flurka.training.init_from import TRUNK
from flurka.training.state import by_path


def _params(workdir) -> dict[str, np.ndarray]:
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        state, _ = ckpt.restore_saved(ckpt.latest_step())
    return {k: np.asarray(v) for k, v in by_path(state["params"]).items()}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, digits):
    workdir = tmp_path_factory.mktemp("pretrained") / "w"
    run(tiny(steps=4, workdir=str(workdir), checkpoint_every=4, seed=3), dataset=digits)
    return workdir


def test_the_trunk_is_loaded_exactly_and_the_head_is_new(pretrained, digits, tmp_path):
    # a learning rate of 1e-30 (0 is refused): one step moves no parameter by more than 1e-29,
    # so the checkpoint after it holds the parameters the run started from
    frozen = dict(steps=1, learning_rate=1e-30, warmup_steps=0, checkpoint_every=1)
    result = run(tiny(**frozen, init_from=str(pretrained), workdir=str(tmp_path / "tuned")), dataset=digits)
    run(tiny(**frozen, workdir=str(tmp_path / "scratch")), dataset=digits)
    source, tuned, scratch = (_params(d) for d in (pretrained, tmp_path / "tuned", tmp_path / "scratch"))
    trunk = [k for k in tuned if k.startswith(TRUNK)]
    head = [k for k in tuned if not k.startswith(TRUNK)]
    assert trunk and head and set(tuned) == set(source)
    same = dict(rtol=0, atol=1e-28)
    for k in trunk:
        np.testing.assert_allclose(tuned[k], source[k], err_msg=k, **same)
    for k in head:   # drawn as a run from scratch draws it, not the pre-trained run's
        np.testing.assert_allclose(tuned[k], scratch[k], err_msg=k, **same)
        assert not np.allclose(tuned[k], source[k], rtol=0, atol=1e-6), k
    lineage = result["init_from"]
    assert (lineage["workdir"], lineage["step"], lineage["attention"]) == (str(pretrained), 4, "full")
    assert lineage["copied"] == len(trunk) and lineage["new"] == []
    assert result["config"]["init_from"] == str(pretrained)


@pytest.mark.parametrize("changes,needle", [
    ({"model.d_model": 32}, "embedding/position is (64, 16) there but (64, 32) here"),
    ({"model.attention": "linformer"}, "its encoder is another architecture: it has no encoder/layers/0/attention/seq_proj"),
    ({"model.num_layers": 2}, "its encoder is another architecture: it has no encoder/layers/1/"),
])
def test_another_architecture_is_refused_in_one_line(pretrained, digits, changes, needle):
    with pytest.raises(ValueError) as info:
        run(tiny(init_from=str(pretrained), **changes), dataset=digits)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--init-from {pretrained}: ")
    assert needle in message, message


def test_the_cli_refuses_a_dir_without_checkpoints_before_any_compute(tmp_path, capsys):
    import argparse

    from flurka.training import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    code = cli.run(parser.parse_args(["--benchmark", "lra-image-small", "--init-from", str(tmp_path)]))
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err == (f"flurka train: error: {tmp_path} is not a training work dir with checkpoints "
                   f"(no {tmp_path}/checkpoints; train with --workdir and checkpoint_every > 0)")


def test_a_longer_pretrained_position_table_gives_its_first_rows_and_segments_start_new():
    """MLM pre-trained at 512 tokens, fine-tuned at 128 (the paper's WikiText-103 -> GLUE): the
    first 128 rows; a sentence-pair task's segment embeddings, which MLM lacks, start as drawn."""
    from flurka.training.init_from import with_trunk

    rng = np.random.default_rng(0)
    source = {"embedding/position": rng.normal(size=(512, 8)).astype(np.float32),
              "embedding/token/embedding": rng.normal(size=(30, 8)),
              "encoder/final_norm/scale": rng.normal(size=(8,))}
    ours = {"embedding/position": np.zeros((128, 8), np.float32), "embedding/token/embedding": np.zeros((30, 8)),
            "embedding/segment/embedding": np.ones((2, 8)), "encoder/final_norm/scale": np.zeros(8),
            "head/logits/kernel": np.ones((8, 3))}
    out, new = with_trunk(ours, source, "pre")
    np.testing.assert_array_equal(out["embedding/position"], source["embedding/position"][:128])
    assert out["embedding/position"].dtype == np.float32
    np.testing.assert_array_equal(out["encoder/final_norm/scale"], source["encoder/final_norm/scale"])
    assert new == ["embedding/segment/embedding"]
    assert out["embedding/segment/embedding"] is ours["embedding/segment/embedding"]
    assert out["head/logits/kernel"] is ours["head/logits/kernel"]
    with pytest.raises(ValueError, match=r"embedding/position is \(512, 8\) there but \(600, 8\) here"):
        with_trunk({**ours, "embedding/position": np.zeros((600, 8))}, source, "pre")


def test_init_from_an_mlflow_model_uri(pretrained, tmp_path, monkeypatch, capsys):
    """The model a sweep logs (``runs:/ID/model``: a checkpoint step dir) is a source as its work
    dir is: downloaded, then loaded."""
    import argparse
    import json

    import mlflow

    from flurka.training import cli

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("pre", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    step = max(int(p.name) for p in (pretrained / "checkpoints").iterdir() if p.name.isdigit())
    client.log_artifacts(run_id, str(pretrained / "checkpoints" / str(step)), f"model/checkpoints/{step}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    code = cli.run(parser.parse_args([
        "--benchmark", "lra-image-small", "--init-from", f"runs:/{run_id}/model", "--json", "--no-progress",
        *[a for k, v in {"model.d_model": 16, "model.num_heads": 2, "model.num_layers": 1, "model.d_ff": 32,
                         "batch_size": 8, "warmup_steps": 0, "eval_batches": 1,
                         "model.attention_options": {"d_k": 8, "num_features": 8}}.items()
          for a in ("--set", f"{k}={v!r}")], "--steps", "1"]))
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["init_from"]["step"] == step and out["init_from"]["copied"] > 0
    code = cli.run(parser.parse_args(["--benchmark", "lra-image-small", "--init-from", "runs:/nope/model"]))
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith("flurka train: error: --init-from runs:/nope/model: "
                                                            "cannot download it from MLflow")
