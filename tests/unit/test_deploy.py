"""The container and Kubernetes artefacts: Dockerfile, deploy/compose.yaml, deploy/k8s/rayservice.yaml, and
the entrypoint's fail-fast checks (run directly; its SIGTERM drain is tests/cluster/test_entrypoint.py).

No Docker engine or Kubernetes API server is at hand (tests/integration/test_image_build.py builds the image
with buildah). The compose file is checked against the subset written out below, which names every field this
project relies on, and against the official Compose Specification schema as the `docker-compose` 1.29.2 wheel
ships it (`compose/config/compose_spec.json`, unpacked into `.venv/share` by scripts/setup.sh: the package's
pins conflict with this project's, so it is not installed, and no test reaches a package index). No installable package ships KubeRay's
CRD: the RayService's own fields are checked against the subset below, its metadata and pod templates against
the Kubernetes API's strict schemas that kubernetes-validate ships, and its embedded Serve config with Ray's
own `ServeDeploySchema`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "deploy" / "entrypoint.sh"
KUBERNETES = "1.33"  # the Kubernetes API release the manifest is checked against (kubernetes-validate ships 1.25-1.37)


def closed(properties: dict, *required: str) -> dict:
    """A JSON schema object with these properties and no others."""
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


# Compose Specification, the subset used here (https://github.com/compose-spec/compose-spec, schema/compose-spec.json)
_SERVICE = {
    "type": "object",
    "properties": {
        "image": {"type": "string"},
        "build": {
            "type": "object",
            "properties": {"context": {"type": "string"}, "dockerfile": {"type": "string"}},
            "required": ["context"],
        },
        "command": {"type": "array", "items": {"type": "string"}},
        "ports": {"type": "array", "items": {"type": "string", "pattern": r"^([0-9.]+:)?(\$\{[A-Z_]+(:-[0-9]+)?\}|[0-9]+):[0-9]+$"}},
        "expose": {"type": "array", "items": {"type": "string", "pattern": "^[0-9]+$"}},
        "environment": {"type": "object", "additionalProperties": {"type": "string"}},
        "volumes": {"type": "array", "items": {"type": "string", "pattern": "^[a-z0-9-]+:/[^:]+$"}},
        "depends_on": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {"condition": {"enum": ["service_started", "service_healthy", "service_completed_successfully"]}},
                "required": ["condition"],
            },
        },
        "healthcheck": closed(
            {
                "test": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m)$"},
                "timeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m)$"},
                "start_period": {"type": "string", "pattern": "^[0-9]+(ms|s|m)$"},
                "retries": {"type": "integer"},
            },
            "test",
        ),
        "profiles": {"type": "array", "items": {"type": "string"}},
        "restart": {"enum": ["no", "always", "on-failure", "unless-stopped"]},
        "shm_size": {"type": "string"},
        "stop_grace_period": {"type": "string", "pattern": "^[0-9]+(s|m)$"},
    },
    "anyOf": [{"required": ["image"]}, {"required": ["build"]}],
    "additionalProperties": False,
}
COMPOSE_SCHEMA = closed(
    {
        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]*$"},
        "services": {"type": "object", "additionalProperties": _SERVICE, "minProperties": 1},
        "volumes": {"type": "object", "additionalProperties": {"type": ["object", "null"]}},
    },
    "services",
)

# KubeRay RayService CRD (ray.io/v1), the subset used here. Its pod templates are core/v1 PodTemplateSpecs and
# its metadata an ObjectMeta: those are validated against Kubernetes' own (strict) schemas instead, below.
_POD = {"type": "object", "required": ["spec"]}
_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}  # KubeRay: map[string]string
RAYSERVICE_SCHEMA = {
    "type": "object",
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayService"},
        "metadata": {
            "type": "object",
            "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
            "required": ["name"],
        },
        "spec": closed(
            {
                "serviceUnhealthySecondThreshold": {"type": "integer"},
                "deploymentUnhealthySecondThreshold": {"type": "integer"},
                "serveConfigV2": {"type": "string"},
                "rayClusterConfig": closed(
                    {
                        "rayVersion": {"type": "string"},
                        "enableInTreeAutoscaling": {"type": "boolean"},
                        "headGroupSpec": closed({"rayStartParams": _START_PARAMS, "template": _POD}, "template"),
                        "workerGroupSpecs": {
                            "type": "array",
                            "items": closed(
                                {
                                    "groupName": {"type": "string"},
                                    "replicas": {"type": "integer", "minimum": 0},
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer", "minimum": 0},
                                    "rayStartParams": _START_PARAMS,
                                    "template": _POD,
                                },
                                "groupName",
                                "template",
                            ),
                        },
                    },
                    "headGroupSpec",
                ),
            },
            "serveConfigV2",
            "rayClusterConfig",
        ),
    },
    "required": ["apiVersion", "kind", "metadata", "spec"],
}


def test_the_dockerfile_pins_cpu_torch_runs_as_a_user_and_checks_health():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M) and re.search(r"^ARG BASE_IMAGE=python:3\.11-slim", text, re.M)
    assert "torch==2.13.0" in text and text.index("torch==2.13.0") < text.index(" . && ")  # first, as setup.sh
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cpu$", text, re.M)  # PyPI's is CUDA
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n.*/healthz", text, re.M)
    assert 'ENTRYPOINT ["tini", "--", "reasonray-entrypoint"]' in text
    for source in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in source.split():
            assert (REPO / path).exists(), f"Dockerfile copies {path}, which does not exist"


def test_compose_has_the_services_and_named_volumes():
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    jsonschema.validate(compose, COMPOSE_SCHEMA)
    services = compose["services"]
    assert set(services) == {"api", "postgres", "chroma", "simulator"} and services["simulator"]["profiles"] == ["simulated"]
    declared = set(compose["volumes"])
    used = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert used == declared == {"traces", "pgdata", "chroma-data"}
    api = services["api"]
    assert (
        api["environment"]["REASONRAY_STORE__URL"].startswith("postgresql://")
        and "@postgres:5432/" in api["environment"]["REASONRAY_STORE__URL"]
    )
    assert api["environment"]["REASONRAY_MEMORY__CHROMA_URL"] == "http://chroma:8000"
    assert set(api["depends_on"]) <= set(services) and "/healthz" in " ".join(api["healthcheck"]["test"])
    assert (REPO / "deploy" / api["build"]["context"] / api["build"]["dockerfile"]).exists()


COMPOSE_RELEASE = "docker-compose==1.29.2"  # the last release on PyPI; its wheel carries the Compose Specification schema


OFFICIAL_COMPOSE_SCHEMA = REPO / ".venv" / "share" / "compose_spec.json"  # unpacked from the docker-compose wheel by scripts/setup.sh


@pytest.fixture(scope="module")
def official_compose_schema() -> dict:
    """The Compose Specification's JSON schema, as scripts/setup.sh unpacked it from the docker-compose wheel."""
    assert OFFICIAL_COMPOSE_SCHEMA.exists(), (
        f"{OFFICIAL_COMPOSE_SCHEMA} is missing: run scripts/setup.sh (it fetches {COMPOSE_RELEASE} once)"
    )
    schema: dict = json.loads(OFFICIAL_COMPOSE_SCHEMA.read_text())
    jsonschema.Draft201909Validator.check_schema(schema)
    return schema


def test_compose_is_valid_against_the_official_compose_specification_schema(official_compose_schema):
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    # the 2021 schema predates the top-level `name` (added to the specification later); it is checked by hand
    assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", compose.pop("name"))
    validator = jsonschema.Draft201909Validator(official_compose_schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, errors
    # and the schema is strict enough to catch a misspelt field
    broken = {**compose, "services": {**compose["services"], "api": {**compose["services"]["api"], "helthcheck": {}}}}
    assert any("helthcheck" in e.message for e in validator.iter_errors(broken))


def test_the_rayservice_manifest_and_its_serve_config_are_valid():
    from ray.serve.schema import ServeDeploySchema

    [doc] = list(yaml.safe_load_all((REPO / "deploy" / "k8s" / "rayservice.yaml").read_text()))
    jsonschema.validate(doc, RAYSERVICE_SCHEMA)
    cluster = doc["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"], *(w["template"] for w in cluster["workerGroupSpecs"])]
    for pod in pods:  # as a core/v1 PodTemplate: its metadata and template against Kubernetes' strict schemas
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": doc["metadata"], "template": pod}, KUBERNETES, strict=True
        )
    serve = ServeDeploySchema.model_validate(yaml.safe_load(doc["spec"]["serveConfigV2"]))
    [app] = serve.applications
    assert app.import_path == "reasonray.serve_app:build_app"
    for pod in pods:
        [container] = pod["spec"]["containers"]
        names = {e["name"] for e in container["env"]}
        assert {"REASONRAY_STORE__URL", "REASONRAY_MEMORY__CHROMA_URL", "RAY_AUTH_MODE"} <= names
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


# -- the entrypoint, run directly ----------------------------------------------------------------------------


def complete_env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "REASONRAY_DATA_DIR": str(tmp_path),
        "REASONRAY_STORE__URL": "postgresql://reasonray@127.0.0.1:5432/reasonray",
        "REASONRAY_MEMORY__CHROMA_URL": "http://127.0.0.1:8100",
        "OPENAI_API_KEY": "sk-test",
    }


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"REASONRAY_DATA_DIR": None}, "REASONRAY_DATA_DIR is not set"),
        ({"REASONRAY_STORE__URL": None}, "REASONRAY_STORE__URL is not set"),
        ({"REASONRAY_STORE__URL": "mysql://x@y/z"}, "REASONRAY_STORE__URL must be a postgresql:// URL"),
        ({"REASONRAY_MEMORY__CHROMA_URL": None}, "REASONRAY_MEMORY__CHROMA_URL is not set"),
        ({"OPENAI_API_KEY": None}, "OPENAI_API_KEY is not set"),
        ({"REASONRAY_SERVER__PORT": "80a"}, "REASONRAY_SERVER__PORT must be a port number"),
        ({"REASONRAY_DATA_DIR": "/nonexistent/reasonray"}, "is not a writable directory"),
    ],
)
def test_the_entrypoint_fails_fast_naming_the_variable(tmp_path, change, named):
    env = complete_env(tmp_path)
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    done = subprocess.run(["sh", str(ENTRYPOINT), "serve"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 64 and named in done.stderr, done.stderr


def test_the_entrypoint_needs_no_key_for_the_simulated_model_or_chroma_without_memory(tmp_path):
    env = {**complete_env(tmp_path), "REASONRAY_LLM__PROVIDER": "simulated", "REASONRAY_MEMORY__ENABLED": "false"}
    del env["OPENAI_API_KEY"], env["REASONRAY_MEMORY__CHROMA_URL"]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "reasonray").write_text('#!/bin/sh\necho "reasonray $*"\n')  # stands in for the real command: what is exec'd
    (fake / "reasonray").chmod(0o755)
    env["PATH"] = f"{fake}:{env['PATH']}"
    done = subprocess.run(["sh", str(ENTRYPOINT), "serve", "--num-cpus", "2"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "reasonray serve --host 0.0.0.0 --port 8000 --num-cpus 2"
