"""The container image, built for real: deploy/build-image.sh builds the Dockerfile with buildah on a Debian
base made by debootstrap (no Docker engine or image registry here), then commands run inside the image as
its own user: the entrypoint's fail-fast, the installed package, the CPU torch and the writable data volume.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # the build alone takes 10-20 minutes

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "STORAGE_DRIVER": "vfs"}


def buildah(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", *args], env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("building an image needs root (debootstrap, buildah's chroot isolation); run the slow suite as root")
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    assert not missing, (
        f"{', '.join(missing)} missing: make test-slow installs them (scripts/setup.sh --slow: apt-get install buildah debootstrap)"
    )
    tag = f"localhost/reasonray-test:{uuid.uuid4().hex[:8]}"
    # the first build makes the base and installs torch and the project from PyPI: many minutes on two cores
    done = subprocess.run(
        ["nice", "-n", "19", str(REPO / "deploy" / "build-image.sh"), tag], env=ENV, capture_output=True, text=True, timeout=3600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    yield tag
    buildah("rmi", tag)


@pytest.fixture
def container(image: str) -> Iterator[str]:
    made = buildah("from", image)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip().splitlines()[-1]
    yield name
    buildah("rm", name)


def config(name: str, kind: str = "image") -> dict:
    """The Docker-format config of an image or a working container (entrypoint, user, health check...)."""
    done = buildah("inspect", "--type", kind, name)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["Docker"]["config"]


def run_in(container: str, *command: str) -> subprocess.CompletedProcess[str]:
    """Runs a command in the container as the image's user, through the entrypoint the image declares."""
    entrypoint = config(container, "container")["Entrypoint"]
    assert entrypoint == ["tini", "--", "reasonray-entrypoint"]
    return buildah("run", "--isolation", "chroot", container, "--", *entrypoint, *command)


def test_the_image_entrypoint_fails_fast_naming_the_missing_variable(container):
    done = run_in(container, "serve")  # the image sets REASONRAY_DATA_DIR; the store URL is the operator's
    assert done.returncode == 64, done.stdout + done.stderr
    assert "REASONRAY_STORE__URL is not set" in done.stderr


def test_the_image_runs_reasonray_as_its_user_with_cpu_torch_and_a_writable_data_dir(container):
    probe = (
        "import os, pathlib, torch, reasonray.serve_app; "
        "pathlib.Path(os.environ['REASONRAY_DATA_DIR'], 'probe').write_text('ok'); "
        "print(os.getuid(), torch.__version__, torch.cuda.is_available())"
    )
    done = run_in(container, "python", "-c", probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["10001", "2.13.0+cpu", "False"]


def test_the_image_has_the_cli_and_the_health_check_tool(container):
    done = run_in(container, "sh", "-c", "reasonray --help && command -v curl")
    assert done.returncode == 0, done.stderr
    assert "\n  serve " in done.stdout and done.stdout.strip().endswith("/usr/bin/curl")


def test_the_image_keeps_its_health_check_user_and_default_command(image):
    declared = config(image)
    assert declared["Healthcheck"]["Test"][0] == "CMD-SHELL" and "/healthz" in declared["Healthcheck"]["Test"][1]
    assert declared["User"] == "reasonray" and declared["Cmd"] == ["serve"] and "8000/tcp" in declared["ExposedPorts"]
