"""Issue 58, point 7: a sweep on object storage (``--storage s3://…``), against a real local
S3-compatible server (moto's, on 127.0.0.1 and a free port, stopped at the end).

Tune's state and every trial's checkpoints live in the bucket; each trial stages its work dir on
its node's disk. The sweep is stopped between its phases, its local staging dir deleted, and
``--resume`` finishes it from the bucket alone: the base run is not trained again, the α branch
forks from the base's checkpoint fetched from the bucket. A bad URI, an endpoint nobody answers
on and a missing bucket are one line and exit 2 before Ray starts. The credentials (the standard
``AWS_*`` variables) appear in nothing the sweep writes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from testsupport import free_ports

BUCKET = "flurka-sweeps"
SECRET = "flurka-test-secret-5b1e9d"       # the secret key: it must land in no record
TINY = ["--benchmarks", "lra-listops-small", "--variants", "flurka-rnn", "--alphas", "0.5", "--steps", "8",
        "--no-baselines", "--num-cpus", "2",
        *[a for k, v in dict(warmup_steps=0, eval_every=0, log_every=2, batch_size=8, eval_batches=1,
                             **{"model.d_model": 16, "model.d_ff": 32, "model.num_layers": 1}).items() for a in ("--set", f"{k}={v}")]]


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on 127.0.0.1 (its endpoint URL), stopped after the module's tests."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)   # a line per request otherwise
    (port,) = free_ports(1)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The standard AWS settings pointing at the server (as each node would have them), and a
    boto3 client; the bucket exists."""
    import boto3

    env = {"AWS_ACCESS_KEY_ID": "flurka-test-key", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_server}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3")
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    return client


def _objects(client, prefix: str) -> dict[str, dict]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o for page in pages for o in page.get("Contents", [])}


def _cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``flurka sweep``'s own parser and run, in this process: (exit status, stderr lines)."""
    from flurka.sweeps import cli, spec

    parser = spec.ArgumentParser(prog="flurka sweep")
    cli.add_arguments(parser)
    rc = cli.run(parser.parse_args(argv))
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.mark.slow
def test_sweep_on_object_storage_resumes_from_it_alone(s3, tmp_path, tiny_overrides, mlflow_runs, monkeypatch):
    import sqlalchemy as sa

    from flurka.sweeps import runner
    from flurka.sweeps.branching import make_plan
    from flurka.sweeps.spec import SweepSpec, validate
    from flurka.sweeps.trainable import work_dir

    prefix = f"sweeps/{tmp_path.name}"
    uri = f"s3://{BUCKET}/{prefix}"
    run_dir = tmp_path / "run"
    spec = SweepSpec(benchmarks=("lra-listops-small",), variants=("flurka-rnn",), alphas=(0.5,), steps=8,
                     overrides=tiny_overrides, baselines=False, run_dir=str(run_dir), num_cpus=2, name="stored",
                     storage=uri)
    plan = make_plan(validate(spec))
    (base,), (branch,) = plan.bases, plan.branches
    base_dir, branch_dir = work_dir("", base.key).name, work_dir("", branch.key).name

    # 1. The first phase (the base run, to its fork at step 4), then a stop between the phases.
    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(runner, "unforkable", stop)
        with pytest.raises(runner.SweepInterrupted):
            runner.run_sweep(spec)
    stored = _objects(s3, prefix + "/")
    assert f"{prefix}/sweep.json" in stored
    base_steps = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}/work/{base_dir}/steps.json")["Body"].read())
    assert base_steps["steps"][:4] == [1, 2, 3, 4]                   # every checkpoint up to the fork, whole
    assert any(k.startswith(f"{prefix}/work/{base_dir}/checkpoints/4/") for k in stored)
    assert any(k.startswith(f"{prefix}/tune/") and "-first/" in k for k in stored)   # Tune's state
    assert not (run_dir / "tune").exists()
    base_manifest = stored[f"{prefix}/work/{base_dir}/steps.json"]["LastModified"]

    # 2. The node's staging dir is lost; --resume finishes from the bucket.
    shutil.rmtree(run_dir / "work")
    out = runner.run_sweep(dataclasses.replace(spec, resume=True))
    assert not out.failed and not out.skipped and set(out.results) == {base.key, branch.key}
    assert not (run_dir / "work" / base_dir / ".lock").exists()       # the base did not train again ...
    assert [p.name for p in (run_dir / "work" / base_dir / "checkpoints").iterdir()] == ["4"]   # ... its fork step came from the bucket
    got, base_result = out.results[branch.key], out.results[base.key]
    forked = [(h["step"], h["loss"]) for h in got["history"] if h["step"] <= 4]
    assert forked and forked == [(h["step"], h["loss"]) for h in base_result["history"] if h["step"] <= 4]
    assert got["steps"] == 8 and got["final_metrics"]

    stored = _objects(s3, prefix + "/")
    assert stored[f"{prefix}/work/{base_dir}/steps.json"]["LastModified"] == base_manifest
    branch_steps = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}/work/{branch_dir}/steps.json")["Body"].read())
    assert branch_steps["steps"][-1] == 8 and len(branch_steps["steps"]) <= 2          # keep_checkpoints=2, mirrored
    assert any(k.startswith(f"{prefix}/work/{branch_dir}/checkpoints/8/") for k in stored)
    assert not any(k.startswith(f"{prefix}/work/{branch_dir}/checkpoints/1/") for k in stored)   # dropped with orbax's
    assert any("-branches/" in k for k in stored)
    record = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}/sweep-record.json")["Body"].read())
    assert [t["trial_key"] for t in record["trials"]] == [branch.key] and record["sweep_id"] == out.sweep_id

    engine = sa.create_engine(out.results_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT trial_key, status FROM trials")).all()
    engine.dispose()
    assert [(r.trial_key, r.status) for r in rows] == [(branch.key, "ok")]
    client, runs = mlflow_runs(out.mlflow_uri, "stored")
    by_kind = {r.data.tags.get("flurka.kind"): r for r in runs}
    assert by_kind["base"].info.status == by_kind["branch"].info.status == "FINISHED"
    parent = next(r for r in runs if r.info.run_id == out.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.params["spec.storage"] == uri
    assert parent.data.tags["flurka.model.lra-listops-small"] == f"runs:/{by_kind['branch'].info.run_id}/model"
    assert [a.path for a in client.list_artifacts(by_kind["branch"].info.run_id, "model/checkpoints")] \
        == ["model/checkpoints/8"]                                     # the best model, fetched from the bucket

    # The credentials are nowhere the sweep wrote: its run dir (but Ray's own session), the bucket, MLflow.
    for path in run_dir.rglob("*"):
        if path.is_file() and "ray" not in path.relative_to(run_dir).parts[:1]:
            assert SECRET.encode() not in path.read_bytes(), path
    for key in stored:
        assert SECRET.encode() not in s3.get_object(Bucket=BUCKET, Key=key)["Body"].read(), key
    assert not any(SECRET in str(v) for r in runs for v in (*r.data.params.values(), *r.data.tags.values()))


def test_bad_storage_is_one_line_before_ray(s3, s3_server, tmp_path, monkeypatch, capsys):
    """A URI that is no object storage, credentials in the URI, a missing bucket, an endpoint
    nobody answers on, a prefix that holds another sweep: one line, exit 2, nothing created,
    Ray never started."""
    import ray

    from flurka.cluster.storage import write_json

    write_json(f"s3://{BUCKET}/taken/sweep.json", {"sweep_id": "stored-1"})
    (closed,) = free_ports(1)
    cases = [
        (str(tmp_path / "shared"), "--storage must be object storage, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX", None),
        (f"s3://flurka-test-key:{SECRET}@{BUCKET}/p", "--storage holds credentials: give them to every node", None),
        (f"s3://{BUCKET}/p?endpoint_override=localhost", "--storage has a query string: give an S3-compatible", None),
        ("s3://no-such-bucket/p", "--storage s3://no-such-bucket/p: cannot write an object there and read it back:", None),
        (f"s3://{BUCKET}/p", f"--storage s3://{BUCKET}/p: cannot write an object there and read it back:",
         f"http://127.0.0.1:{closed}"),
        (f"s3://{BUCKET}/taken", f"--storage s3://{BUCKET}/taken holds sweep stored-1 already: add --resume", None),
    ]
    for uri, want, endpoint in cases:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint or s3_server)
        run_dir = tmp_path / "run"
        rc, err = _cli([*TINY, "--run-dir", str(run_dir), "--storage", uri], capsys)
        assert rc == 2 and len(err) == 1, (uri, err)
        assert err[0].startswith(f"flurka sweep: error: {want}"), err[0]
        assert SECRET not in err[0]
        assert not run_dir.exists() and not ray.is_initialized()
    assert "bucket does not exist" in _cli([*TINY, "--run-dir", str(tmp_path / "r"), "--storage",
                                            "s3://no-such-bucket/p"], capsys)[1][0]


def test_work_dir_mirror_moves_whole_steps_only(s3, tmp_path):
    """A step travels whole: one that is uploaded but not yet named in ``steps.json`` (a trial
    killed mid-upload) is never fetched; a step Orbax dropped leaves the bucket too."""
    from flurka.cluster.storage import WorkDir

    local = tmp_path / "a"
    for step in (1, 2):
        (local / "checkpoints" / str(step) / "state").mkdir(parents=True)
        (local / "checkpoints" / str(step) / "state" / "data").write_bytes(bytes([step]) * 100)
    (local / "checkpoints" / "3.orbax-checkpoint-tmp-1").mkdir()       # a save in progress: not a step
    uri = f"s3://{BUCKET}/mirror/{tmp_path.name}"
    mirror = WorkDir(uri, local)
    assert mirror.push() == [1, 2] and mirror.push() == []
    s3.put_object(Bucket=BUCKET, Key=f"mirror/{tmp_path.name}/checkpoints/9/state/data", Body=b"half")

    other = WorkDir(uri, tmp_path / "b")
    assert other.pull({2}) == [2] and other.local_steps() == [2]
    assert other.pull() == [1] and other.local_steps() == [1, 2]
    assert (tmp_path / "b" / "checkpoints" / "2" / "state" / "data").read_bytes() == bytes([2]) * 100
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.startswith(".pull")]

    shutil.rmtree(local / "checkpoints" / "1")                         # Orbax's max_to_keep
    (local / "checkpoints" / "4").mkdir()
    (local / "checkpoints" / "4" / "x").write_text("4")
    assert mirror.push() == [4]
    keys = _objects(s3, f"mirror/{tmp_path.name}/")
    assert not any("/checkpoints/1/" in k for k in keys) and any("/checkpoints/4/" in k for k in keys)
    assert WorkDir(uri, tmp_path / "c").remote_steps() == [2, 4]


def test_storage_is_a_spec_field(tmp_path):
    """``storage`` is a sweep-file key and a flag like any other, stored as given (no secret)."""
    from flurka.sweeps.spec import from_args, parse, stored_dict

    path = tmp_path / "s.yaml"
    path.write_text(f"benchmarks: [lra-listops-small]\nstorage: s3://{BUCKET}/x\n")
    assert from_args(argparse.Namespace(config=str(path))).storage == f"s3://{BUCKET}/x"
    spec = parse(["--benchmarks", "lra-listops-small", "--storage", "gs://b/p"])
    assert spec.storage == "gs://b/p" and stored_dict(spec)["storage"] == "gs://b/p"


# -- two nodes whose staging dirs differ ---------------------------------------------------------

@pytest.fixture(scope="module")
def two_nodes(s3_server):
    """A 2-node Ray cluster (testsupport.two_node_cluster) whose nodes carry the AWS settings in
    the environment ``ray start`` runs in, as a real cluster's would, the second node's disk its
    own at ``hidden``. Yields (address, env, hidden folder, the second node's id, every node's
    id); the test process is connected to the cluster as a driver."""
    import tempfile
    import types

    from testsupport import private_mounts_refused, two_node_cluster

    hidden = Path(tempfile.mkdtemp(prefix="frk-s3h-", dir="/tmp"))
    try:
        refused = private_mounts_refused(hidden)
        if refused:
            pytest.skip(f"cannot give the second node a disk of its own: {refused}")
        aws = dict(AWS_ACCESS_KEY_ID="flurka-test-key", AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1",
                   AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=s3_server)
        with two_node_cluster(hidden, env=aws, prefix="frk-s3") as cluster:
            yield types.SimpleNamespace(address=cluster.address, env=cluster.env, hidden=hidden,
                                        second=cluster.second["NodeID"], nodes=cluster.nodes)
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


@pytest.mark.slow
def test_two_nodes_without_a_shared_dir_share_the_bucket(two_nodes, s3, tmp_path):
    """The run dir is each node's own disk (the second node sees an empty tmpfs at its path): the
    sweep checks that both nodes reach the bucket, the two α branches run one per node, and the
    one on the node that did not train the base fetches the base's fork step from the bucket."""
    import subprocess
    import sys

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    root = Path(__file__).resolve().parents[2]
    run_dir = two_nodes.hidden / "sweep"
    uri = f"s3://{BUCKET}/two-nodes/{tmp_path.name}"
    args = [a for a in TINY if a not in ("--num-cpus", "2")]
    alphas = args.index("--alphas") + 1
    args[alphas] = "0.25,0.5"
    proc = subprocess.run([sys.executable, "experiments/uptrain_sweep.py", *args, "--name", "two",
                           "--address", two_nodes.address, "--run-dir", str(run_dir), "--storage", uri],
                          env=two_nodes.env, cwd=root, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Trials: 3 finished, 0 stopped early, 0 failed" in proc.stdout, proc.stdout[-3000:]

    def _listing(run_dir: str) -> dict[str, tuple[list[str], bool]]:
        """On one node: each work dir under ``run_dir/work`` -> (its checkpoint steps, whether a trial
        trained it there: its ``.lock``)."""
        import os

        work = os.path.join(run_dir, "work")
        out = {}
        for name in (os.listdir(work) if os.path.isdir(work) else []):
            ckpts = os.path.join(work, name, "checkpoints")
            out[name] = (sorted(os.listdir(ckpts)) if os.path.isdir(ckpts) else [],
                         os.path.exists(os.path.join(work, name, ".lock")))
        return out

    listing = ray.remote(num_cpus=0)(_listing)   # defined here: pickled by value, not imported from this file
    views = {node: ray.get(listing.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                           .remote(str(run_dir)))
             for node in two_nodes.nodes}
    (base_dir,) = {d for v in views.values() for d in v if d.startswith("base__")}
    trained_base = [n for n, view in views.items() if view.get(base_dir, ([], False))[1]]
    assert len(trained_base) == 1, views
    (other,) = [n for n in views if n not in trained_base]
    steps, trained = views[other][base_dir]
    assert not trained and steps and set(steps) <= {"2", "4"}, views       # fork steps only, from the bucket
    branches = {n: [d for d, (_, lock) in view.items() if lock and d.startswith("branch")] for n, view in views.items()}
    assert branches[other], views                                           # a branch forked there
    assert sorted(sum(branches.values(), [])) == sorted({d for v in views.values() for d in v if d.startswith("branch")})
    assert len(sum(branches.values(), [])) == 2
    keys = _objects(s3, f"two-nodes/{tmp_path.name}/")
    assert any(f"/work/{base_dir}/checkpoints/4/" in k for k in keys)
    assert SECRET not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_node_that_cannot_reach_the_storage_is_named(two_nodes, monkeypatch):
    """The driver reaches a bucket the nodes do not (its endpoint is another server than the one
    the nodes' environment names): every node is named, in one line, before any trial."""
    import socket
    import subprocess
    import sys
    import time

    import boto3

    from flurka.cluster.storage import StorageError, check_nodes

    (port,) = free_ports(1)   # a server process of its own: the threaded one's buckets are this process's
    other = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert other.poll() is None and time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.3)
        for k, v in dict(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1",
                         AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}").items():
            monkeypatch.setenv(k, v)
        boto3.client("s3").create_bucket(Bucket="driver-only")
        with pytest.raises(StorageError) as err:
            check_nodes("s3://driver-only/p", embedded=False, timeout_s=60)
        line = str(err.value)
        assert "\n" not in line and SECRET not in line
        assert line.startswith("--storage s3://driver-only/p is out of reach of 2 of the cluster's 2 nodes: "), line
        assert f"(node {two_nodes.second[:8]}: " in line and "give every node the endpoint and credentials" in line
        left = boto3.client("s3").list_objects_v2(Bucket="driver-only").get("Contents", [])
        assert [o["Key"] for o in left if not o["Key"].endswith("/")] == []   # the marker is gone (pyarrow keeps "p/")
    finally:
        other.terminate()
        other.wait(30)
