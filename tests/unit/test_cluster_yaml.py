"""cluster.yaml, cluster.onprem.yaml and deploy/serve_config.yaml pass Ray's own validation and agree
with how ReasonRay must be started."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from reasonray.kernel.config import Settings
from reasonray.serve_app import AppArgs
from tests.ray_private import validate_cluster_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster.onprem.yaml"])
def test_cluster_files_pass_rays_own_validation(name):
    config = yaml.safe_load((REPO / name).read_text())
    validate_cluster_config(config)
    head = " ".join(config["head_start_ray_commands"])
    workers = " ".join(config["worker_start_ray_commands"])
    assert "reasonray serve --address auto" in head and "chroma run" in head
    for commands in (head, workers):
        assert "RAY_AUTH_MODE=token" in commands and "RAY_SERVE_ENABLE_HA_PROXY=1" in commands
        assert "--metrics-export-port=8080" in commands
    assert any("scripts/setup.sh" in c for c in config["setup_commands"])  # torch CPU first, then ReasonRay
    assert config["file_mounts"]["/home/ubuntu/.ray/auth_token"] == "~/.ray/auth_token"


def test_the_onprem_variant_lists_its_machines():
    config = yaml.safe_load((REPO / "cluster.onprem.yaml").read_text())
    assert config["provider"]["type"] == "local" and config["provider"]["head_ip"] and config["provider"]["worker_ips"]


def test_the_serve_config_file_is_a_valid_serve_deploy_config_for_build_app():
    config = yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    [app] = schema.applications
    assert app.import_path == "reasonray.serve_app:build_app"
    AppArgs.model_validate(app.args)  # the builder accepts its args
    [deployment] = app.deployments
    assert deployment.name == "ReasonRayIngress" and deployment.autoscaling_config["max_replicas"] >= 1
    env = app.runtime_env["env_vars"]
    assert env["RAY_AUTH_MODE"] == "token" and env["REASONRAY_MEMORY__CHROMA_URL"].startswith("http://")
    # it binds every interface, so it must turn authentication on (build_app refuses otherwise)
    assert schema.http_options.host == "0.0.0.0" and env["REASONRAY_AUTH__JWT_SECRET"] == "${REASONRAY_AUTH__JWT_SECRET}"


def test_build_app_refuses_a_non_loopback_bind_without_auth():
    # in a fresh interpreter (one for the three addresses: importing the Serve app takes seconds): in one where
    # Serve already runs (the integration tests' cluster), build_app rightly checks the address Serve's proxy
    # holds, not [server] host
    script = """
import pytest
from reasonray.kernel.config import ConfigError
from reasonray.serve_app import build_app

settings = {"llm": {"provider": "simulated", "base_url": "http://127.0.0.1:9/v1"}, "memory": {"enabled": False}}
for host in ("0.0.0.0", "10.0.0.5", "::"):
    with pytest.raises(ConfigError, match=f"refusing to serve on {host} without authentication"):
        build_app({"settings": {**settings, "server": {"host": host}}})
    build_app({"settings": {**settings, "server": {"host": host}, "auth": {"jwt_secret": "s" * 32}}})
build_app({"settings": {**settings, "server": {"host": "127.0.0.1"}}})
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_autoscaling_settings_become_serves_autoscaling_config():
    from reasonray.serve_app import build_app

    settings = Settings.model_validate(
        {
            "llm": {"provider": "simulated", "base_url": "http://127.0.0.1:9/v1"},
            "memory": {"enabled": False},
            "server": {"autoscaling": {"enabled": True, "min_replicas": 2, "max_replicas": 6}},
        }
    )
    app = build_app({"settings": settings.model_dump(mode="json")})
    options = app._bound_deployment._deployment_config
    assert options.autoscaling_config.min_replicas == 2 and options.autoscaling_config.max_replicas == 6
    with pytest.raises(ValueError, match="above max_replicas"):
        Settings.model_validate({"server": {"autoscaling": {"min_replicas": 5, "max_replicas": 2}}})
