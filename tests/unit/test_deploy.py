"""Deployment files describe the same farm as the code: Dockerfiles agree with the worker pins,
compose and Kubernetes with the queue names, FARM_* settings, image tags and ports the code uses;
the Kubernetes manifests render (kubectl kustomize) and validate (kubernetes-validate)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from farm.pipeline.queues import compile_queue

ROOT = Path(__file__).resolve().parents[2]
WORKERS = sorted(p for p in (ROOT / "infra" / "workers").iterdir() if (p / "requirements.txt").is_file())
QNN = [p for p in WORKERS if p.name.startswith("qnn-")]


def settings_vars() -> set[str]:
    text = (ROOT / "farm" / "core" / "settings.py").read_text()
    return set(re.findall(r"\"(FARM_[A-Z_]+)\"", text)) | {"FARM_HOME"}


def pinned(req: Path) -> dict[str, str]:
    out = {}
    for line in req.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.split("[")[0].lower()] = version
    return out


def generator():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("worker_dockerfile", ROOT / "infra" / "workers" / "dockerfile.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def toolchain_of(kind: Path) -> str:
    return str(generator().toolchain(kind.name))


@pytest.mark.parametrize("kind", WORKERS, ids=lambda p: p.name)
def test_worker_dockerfile_matches_its_pins(kind: Path) -> None:
    df = (kind / "Dockerfile").read_text()
    assert df == generator().render(kind.name), "stale: run python infra/workers/dockerfile.py"
    assert f"COPY infra/workers/{kind.name}/requirements.txt" in df
    assert "pip install -r /opt/ctxfarm/requirements.txt" in df
    assert f'io.ctxfarm.toolchain="{toolchain_of(kind)}"' in df
    assert f'io.ctxfarm.worker-kind="{kind.name}"' in df
    assert re.search(r"^USER 10001$", df, re.M) and "HEALTHCHECK" in df
    assert re.search(r"^FROM python:\d+\.\d+\.\d+-slim-bookworm$", df, re.M), "a pinned base image"
    backend = kind.name.split("-")[0]
    # ENTRYPOINT is farm, CMD the worker: Kubernetes args and compose commands replace only CMD.
    assert 'ENTRYPOINT ["farm"]' in df and f'CMD ["worker", "--backend", "{backend}"]' in df


def test_api_image() -> None:
    df = (ROOT / "infra" / "images" / "api" / "Dockerfile").read_text()
    assert "USER 10001" in df and "HEALTHCHECK" in df and "/healthz" in df and "EXPOSE 8080" in df
    reqs = pinned(ROOT / "infra" / "images" / "api" / "requirements.txt")
    assert {"fastapi", "uvicorn", "sqlalchemy", "celery", "boto3"} <= set(reqs)


def compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "infra" / "compose.yml").read_text())


def test_compose_describes_the_farm() -> None:
    c = compose()
    svc = c["services"]
    assert {"postgres", "redis", "seaweedfs", "migrate", "api", "flower"} <= set(svc)
    for kind in WORKERS:
        name = "worker-" + kind.name.replace(".", "-")
        assert svc[name]["image"] == f"ctxfarm-worker:{kind.name}"
        assert svc[name]["build"]["dockerfile"] == f"infra/workers/{kind.name}/Dockerfile"
    assert svc["migrate"]["command"] == ["db", "upgrade"]
    assert svc["api"]["ports"] == ["8080:8080"] and "/readyz" in str(svc["api"]["healthcheck"])
    for name in ("postgres", "redis", "seaweedfs", "api"):
        assert "healthcheck" in svc[name]
    assert set(c["volumes"]) == {"pgdata", "redisdata", "blobdata"}
    env = svc["api"]["environment"]
    assert {k for k in env if k.startswith("FARM_")} <= settings_vars()


def render(overlay: str) -> list[dict]:  # type: ignore[type-arg]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed here")
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "infra" / "k8s" / "overlays" / overlay)],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_manifests_render_and_validate(overlay: str) -> None:
    import kubernetes_validate

    docs = render(overlay)
    crds = {"ScaledObject", "ServiceMonitor"}
    for d in docs:
        if d["kind"] in crds:
            continue  # no schema in kubernetes-validate; checked below
        kubernetes_validate.validate(d, "1.32", strict=True)
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for so in scaled:
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        assert so["spec"]["scaleTargetRef"]["name"] in deployments
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "redis" and trigger["metadata"]["listName"].startswith("compile.")
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"


def test_pools_use_the_code_s_queue_names_tags_and_settings() -> None:
    docs = render("prod")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    listnames = {d["spec"]["scaleTargetRef"]["name"]: d["spec"]["triggers"][0]["metadata"]["listName"]
                 for d in docs if d["kind"] == "ScaledObject"}
    known = settings_vars()
    for kind in WORKERS:
        name = "ctxfarm-worker-" + kind.name.replace(".", "-")
        dep = deployments[name]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in c["env"]}
        if kind.name.startswith("qnn-"):
            queue = compile_queue("qnn", toolchain_of(kind))
        else:
            queue = compile_queue("trt", f"{toolchain_of(kind)}+linux-x86-64", "sm_90")
        assert env["CTXFARM_WORKER_QUEUE"] == queue == listnames[name]
        assert c["image"].endswith(f":{kind.name}")
        assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 1800
        assert c["lifecycle"]["preStop"]["exec"]["command"][-1].count(env["CTXFARM_BUSY_FILE"]) == 1
        assert c["args"][0] == "worker"  # the image's ENTRYPOINT is farm
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    secret = next(d for d in docs if d["kind"] == "Secret")
    farm_vars = {k for k in [*config["data"], *secret["data"]] if k.startswith("FARM_")}
    assert farm_vars <= known, farm_vars - known
    api = deployments["ctxfarm-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["ports"][0]["containerPort"] == 8080
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz" and api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    _one_process_per_core(api["args"], api["resources"]["limits"]["cpu"], api["resources"]["requests"]["cpu"])


def _one_process_per_core(args: list[str], limit: object, request: object) -> None:
    """`farm serve` runs one process per core of its CPU quota: the quota is a whole
    number of cores, requested as well as allowed, and no --workers in the args disagrees."""
    from farm.cli.service_cmd import serve_processes
    from farm.core.settings import Settings

    cores = float(str(limit))
    assert cores == int(cores) >= 1 and str(request) == str(limit), (limit, request)
    assert "--workers" not in args, args
    pg = Settings.from_env({"FARM_HOME": "/nonexistent/x", "FARM_DATABASE_URL": "postgresql+psycopg://h/db"})
    assert serve_processes(None, pg, cores=int(cores)) == int(cores)


def test_compose_runs_one_api_process_per_core() -> None:
    api = compose()["services"]["api"]
    _one_process_per_core(api["command"], api["cpus"], api["cpus"])


def test_serve_defaults_and_probe_paths_match() -> None:
    from farm.api.app import create_app
    from farm.cli import build_parser
    from farm.core.settings import Settings

    args = build_parser("serve").parse_args(["serve"])
    assert args.port == 8080
    # The OpenAPI document: the routes live in included routers, not flat on app.routes.
    paths = set(create_app(Settings.from_env({"FARM_HOME": "/nonexistent/x"}),
                           registry=_NoRegistry()).openapi()["paths"])  # type: ignore[arg-type]
    assert {"/healthz", "/readyz", "/metrics"} <= paths


class _NoRegistry:
    """create_app only keeps the registry; routes are what this test reads."""

    store = None
    db = None
