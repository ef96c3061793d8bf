"""What run.json records so that a reader can tell what produced the results: the code (commit, dirty tree),
the model (served name, what the server says of itself, the model file's hash when it is on this machine),
the settings that change results, the dataset's hash and the command line. Every probe is best-effort and
short: what cannot be known is recorded as None, never guessed."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import structlog

from reasonray.kernel.config import Settings

log = structlog.get_logger(__name__)

PROBE_TIMEOUT_S = 5.0
REPOSITORY = Path(__file__).resolve().parents[2]


def git_state(where: Path = REPOSITORY) -> dict[str, Any]:
    """`git_commit` (None outside a checkout) and `git_dirty` (tracked files changed since the commit)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


def file_sha256(path: str | Path) -> str | None:
    """The hash of a file on this machine (a model file), or None when it is not here."""
    path = Path(path)
    if not path.is_file():
        return None
    with path.open("rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def _get(url: str) -> tuple[dict[str, Any] | None, dict[str, str]]:
    try:
        response = httpx.get(url, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.info("evals.provenance_probe_failed", url=url, error=str(exc)[:200])
        return None, {}
    headers = {k: v for k, v in response.headers.items() if k.lower() in ("server", "x-powered-by")}
    try:
        body = response.json() if response.status_code == 200 else None
    except ValueError:
        body = None
    return (body if isinstance(body, dict) else None), headers


def endpoint_model(base_url: str | None, served_name: str | None) -> dict[str, Any]:
    """What an OpenAI-compatible endpoint says of itself: its /v1/models entry for the served name, and for
    llama.cpp's server its /props (model file path, build), the file's sha256 when the file is on this machine."""
    info: dict[str, Any] = {"served_name": served_name, "base_url": base_url, "models_entry": None, "server": None}
    info.update(model_path=None, model_sha256=None, server_build=None)
    if not base_url:
        return info
    base = base_url.rstrip("/")
    models, headers = _get(f"{base}/models")
    info["server"] = headers.get("server") or headers.get("Server")
    entries = (models or {}).get("data") or []
    info["models_entry"] = next((e for e in entries if isinstance(e, dict) and e.get("id") == served_name), entries[0] if entries else None)
    props, _ = _get(f"{base.removesuffix('/v1')}/props")  # llama.cpp's server
    if props:
        info["model_path"] = props.get("model_path")
        info["server_build"] = props.get("build_info") or props.get("build")
        if isinstance(info["model_path"], str):
            info["model_sha256"] = file_sha256(info["model_path"])
    return info


def local_model(settings: Settings) -> dict[str, Any]:
    """The model `reasonray serve --llm local` serves with this checkout's [llm.local] (the bundled SmolLM2 file
    unless model_path names another): its file, hash and llama.cpp settings (threads and context change speed,
    and the context what fits)."""
    from reasonray.gateway.errors import LLMConfigError
    from reasonray.gateway.local_model import model_path

    section = settings.llm.local
    try:
        path = model_path(section)
    except LLMConfigError as exc:
        return {"path": None, "sha256": None, "unavailable": str(exc)[:300]}
    return {"path": str(path), "sha256": file_sha256(path), **section.model_dump(mode="json", exclude={"model_path"})}


def package_versions() -> dict[str, str | None]:
    """Versions of what serves and runs the model here, where installed (llama-cpp-python, openai, ray)."""
    versions: dict[str, str | None] = {}
    for name in ("reasonray", "llama-cpp-python", "openai", "ray"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(settings: Settings, *, service_url: str | None, dataset_sha256: str, over_service: bool = False) -> dict[str, Any]:
    """Everything run.json records about where the results came from. `over_service`: the examples ran through a
    service (at `service_url`, or a client given in process), whose own model and settings answered."""
    record: dict[str, Any] = {
        **git_state(),
        "command": sys.argv,
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "dataset_sha256": dataset_sha256,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
    }
    if over_service or service_url is not None:  # the service's model: it answers through its own [llm]
        models, headers = _get(f"{service_url.rstrip('/')}/v1/models") if service_url else (None, {})
        record["service"] = {"url": service_url, "v1_models": models, "server": headers.get("server")}
        record["model"] = {"served_name": None}  # known from the results once they are in (run.py fills it)
        record["local_model"] = local_model(settings)  # what `--llm local` serves from this checkout, if that is the service
        record["settings"] = None  # the service's own; this process's config does not apply
    else:
        record["model"] = endpoint_model(settings.llm.base_url, settings.llm.model)
        record["settings"] = {  # the ReasonRay settings that change results
            "llm": settings.llm.model_dump(mode="json"),  # cache, retries, timeouts, sampling defaults (no secrets: a variable's name)
            "budget": settings.budget.model_dump(mode="json"),
            "reasoning": settings.reasoning.model_dump(mode="json", exclude={"enabled_strategies"}),
            "memory": settings.memory.model_dump(mode="json"),
        }
    return record
