"""The deployment files parse and satisfy what their consumers require.

No Docker engine or Kubernetes runs here, so each file is checked by the validator its consumer
uses where one exists (Ray's own cluster-config schema) and otherwise by the fields the consumer
requires (KubeRay's RayJob CRD, the compose spec).
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"


def _load(rel: str) -> dict:
    return yaml.safe_load((INFRA / rel).read_text())


# --- Ray cluster launcher -------------------------------------------------------------------

def test_ray_cluster_config_passes_rays_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _load("ray/cluster-aws-gpu.yaml")
    validate_config(prepare_config(copy.deepcopy(config)))


def test_ray_cluster_offers_a100_and_h100_nodes_on_shared_storage():
    config = _load("ray/cluster-aws-gpu.yaml")
    types = config["available_node_types"]
    accelerators = {k for t in types.values() for k in t.get("resources", {}) if k.startswith("accelerator_type:")}
    assert accelerators == {"accelerator_type:A100", "accelerator_type:H100"}
    assert config["docker"]["image"]
    assert any("/mnt/shared" in opt for opt in config["docker"]["run_options"])
    start = " ".join(config["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=token" in start and "--dashboard-host=127.0.0.1" in start


def test_ray_cluster_config_with_a_typo_is_rejected():
    """The validation above can fail: an unknown top-level key is refused by Ray's schema."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _load("ray/cluster-aws-gpu.yaml")
    config["max_wokers"] = 3
    with pytest.raises(Exception, match="max_wokers"):
        validate_config(prepare_config(config))


# --- KubeRay RayJob ---------------------------------------------------------------------------

def _pod_containers(template: dict) -> list[dict]:
    containers = template["spec"]["containers"]
    assert containers, "a pod template needs at least one container"
    for c in containers:
        assert c.get("name") and c.get("image"), c
    return containers


def test_rayjob_has_the_fields_kuberay_requires():
    job = _load("kuberay/rayjob.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"])
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    _pod_containers(cluster["headGroupSpec"]["template"])
    assert isinstance(cluster["headGroupSpec"]["rayStartParams"], dict)
    for group in cluster["workerGroupSpecs"]:
        assert group["groupName"]
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        containers = _pod_containers(group["template"])
        assert any("nvidia.com/gpu" in c["resources"]["limits"] for c in containers)
    yaml.safe_load(spec["runtimeEnvYAML"])  # the embedded runtime env is YAML too


def test_rayjob_entrypoint_runs_the_sweep_script():
    job = _load("kuberay/rayjob.yaml")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["python", "experiments/uptrain_sweep.py"]
    assert (ROOT / argv[1]).is_file()
    from flurka.sweeps.spec import parse, validate

    spec = parse(argv[2:])  # the sweep's own parser accepts the job's arguments
    assert spec.gpus_per_trial == 0.5 and spec.run_dir == "/mnt/shared/flurka"
    assert spec.results_db and sa.make_url(spec.results_db).password is None   # Ray keeps the entrypoint
    validate(spec)  # and the sweep it describes is valid (benchmarks, variants, α grid)


# --- compose -----------------------------------------------------------------------------------

def test_compose_submits_the_sweep_without_a_password():
    """Issue 58: the example job's --results-db held the password, which Ray's job records keep."""
    text = (INFRA / "compose/compose.yaml").read_text()
    (submitted,) = re.findall(r"--results-db (\S+://\S+)", text)
    assert sa.make_url(submitted).password is None
    assert _load("compose/compose.yaml")["services"]["ray-head"]["environment"]["PGPASSWORD"].startswith("${")


def test_compose_services_bind_loopback_and_take_credentials_from_env():
    compose = _load("compose/compose.yaml")
    services = compose["services"]
    assert {"postgres", "mlflow", "ray-head"} <= set(services)
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), name
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"
        for key, value in svc.get("environment", {}).items():
            if re.search("PASSWORD|TOKEN", key):
                assert str(value).startswith("${"), f"{name}.{key} must come from the environment"
            for secret in re.findall(r"://[^:/@\s]+:([^@\s]+)@", str(value)):
                assert secret.startswith("${"), f"{name}.{key} embeds a literal password"


# --- image -------------------------------------------------------------------------------------

def test_dockerfile_installs_with_the_readme_install_step():
    lines = (INFRA / "docker/Dockerfile").read_text().splitlines()
    assert lines and any(l.startswith("FROM python:3.1") for l in lines)
    runs = [l for l in lines if l.startswith("RUN make ")]
    assert runs and "make install" in runs[0]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^install:", makefile, re.M)
    assert "make" in (ROOT / "README.md").read_text()


def test_no_credentials_are_committed():
    pattern = re.compile(r"(password|secret|token)\s*[:=]\s*['\"]?[A-Za-z0-9/+]{12,}", re.I)
    for path in INFRA.rglob("*"):
        if path.is_file():
            assert not pattern.search(path.read_text()), path
