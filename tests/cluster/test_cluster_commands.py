"""The operators' and researchers' cluster commands on a local Ray cluster with a dashboard (the job
server and Serve's REST API): `ray job submit` of an evaluation, the way docs/evaluation.md tells a
researcher to run it (the repository uploaded as the working directory, 50 GSM8K examples, report and
plots written; then a memory-aware run), and `serve deploy` of deploy/serve_config.yaml, the way
docs/deploy.md tells an operator to start the API without `reasonray serve`.

The cluster is its own (`ray start --head --block` on free ports), stopped by signalling that
process, never with `ray stop`, which would kill every Ray process on the machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from reasonray.actors.environment import ray_environment
from reasonray.gateway.simulator.server import free_port
from reasonray.kernel.config import Settings
from reasonray.kernel.ports import free_block
from tests.integration.conftest import kill_tree, result_of, rpc

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k_test.jsonl"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def dashboard_cluster():
    assert GSM8K.is_file(), f"{GSM8K} is missing: the evaluation tests need the shared GSM8K file beside this checkout"
    # the cluster's listeners below the ephemeral range: a port found free there can be taken by another
    # process's outgoing connection before `ray start` binds it
    first = free_block(5)
    gcs, dashboard, client, agent, metrics = range(first, first + 5)
    # the environment `reasonray serve` gives a cluster, with ingress ports of its own: this process's
    # environment carries the first cluster's HAProxy stats and metrics ports, which are taken
    env = {**os.environ, **ray_environment(Settings()), "PATH": f"{BIN}:{os.environ['PATH']}", "RAY_AUTH_MODE": "token"}
    # a short path: Ray's session sockets live under it, and an AF_UNIX path over 107 bytes fails the dashboard's
    # modules (pytest's own temporary folders run long under a worker: /tmp/pytest-of-root/pytest-3/popen-gw0/...)
    temp = Path(tempfile.mkdtemp(prefix="rr-ray-", dir="/tmp"))
    log = temp / "ray-start.log"  # what `ray start` said, for a failure's message
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={gcs}",
            f"--dashboard-port={dashboard}",
            "--dashboard-host=127.0.0.1",
            "--num-cpus=2",
            f"--ray-client-server-port={client}",
            f"--dashboard-agent-listen-port={agent}",
            f"--metrics-export-port={metrics}",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 240  # its dashboard starts nine processes: a minute on a busy machine
        while True:
            try:  # 401: up, and asking for the cluster's token, which `ray job submit` sends
                if httpx.get(f"{address}/api/version", timeout=2).status_code in (200, 401):
                    break
            except httpx.HTTPError:
                pass
            assert head.poll() is None, f"ray start --head exited:\n{log.read_text(errors='replace')[-3000:]}"
            assert time.monotonic() < deadline, f"the Ray dashboard did not come up in 240 s:\n{log.read_text(errors='replace')[-3000:]}"
            time.sleep(1)
        yield address, env
    finally:
        kill_tree(head)  # a throwaway cluster: nothing of it needs a graceful stop (SIGTERM took 30 s)
        shutil.rmtree(temp, ignore_errors=True)


def submit(address: str, env: dict[str, str], *args: str, runtime_env: dict | None = None) -> subprocess.CompletedProcess:
    command = [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(REPO)]
    if runtime_env:
        command += ["--runtime-env-json", json.dumps(runtime_env)]
    return subprocess.run(
        [*command, "--", "python", "-m", "reasonray.evals.run", *args], env=env, capture_output=True, text=True, timeout=400
    )


# slow suite: the entrypoint the job runs (`python -m reasonray.evals.run`) evaluates a whole GSM8K set in the default run
# (tests/unit/test_full_datasets.py, tests/unit/test_evals.py); what this adds is Ray's job submission and a dashboard
# cluster of its own, 80 s of the default run's 2 cores
@pytest.mark.slow
@pytest.mark.timeout(900)  # the cluster's start (up to 4 minutes on a busy machine) counts too
def test_ray_job_submit_evaluates_50_gsm8k_examples_and_writes_the_report_and_plots(dashboard_cluster, tmp_path):
    address, env = dashboard_cluster
    out = tmp_path / "gsm8k"
    # the same job twice: the second run finds every result already in the output folder
    args = (
        "--dataset",
        str(GSM8K),
        "--strategies",
        "chain_of_thought,self_consistency",
        "--limit",
        "50",
        "--out",
        str(out),
        "--no-progress",
    )
    job = submit(address, env, *args)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stdout + job.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["simulated"] is True and report["cluster"]["ray"] is True and report["cluster"]["nodes"] >= 1
    rows = {r["group"]: r for r in report["rows"]}
    assert set(rows) == {"chain_of_thought/default", "self_consistency/default"}
    assert all(r["examples"] == 50 and r["errors"] == 0 for r in rows.values())
    # the simulated model answers at skill 0.7; five votes recover most of its misses
    assert rows["self_consistency/default"]["accuracy"] > rows["chain_of_thought/default"]["accuracy"]
    assert rows["self_consistency/default"]["llm_calls_per_example"] == 5
    assert len((out / "results.jsonl").read_text().splitlines()) == 100
    assert "accuracy (SIMULATED)" in (out / "report.md").read_text()
    for plot in ("accuracy_vs_tokens.png", "latency.png"):
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"

    again = submit(address, env, *args)
    assert again.returncode == 0 and "0 to run, 100 already in" in again.stdout


# slow suite: the job path is the test above's, memory-aware cells are tests/unit/test_evals.py's (in order, learning as they go)
@pytest.mark.slow
def test_a_memory_aware_evaluation_learns_in_the_run_memory_actor(dashboard_cluster, tmp_path):
    address, env = dashboard_cluster
    out = tmp_path / "memory"
    # the simulated model's /v1/embeddings: the default embedder would load torch in the memory actor
    job = submit(
        address,
        env,
        "--dataset",
        str(GSM8K),
        "--strategies",
        "chain_of_thought",
        "--limit",
        "6",
        "--out",
        str(out),
        "--memory",
        "--no-progress",
        runtime_env={"env_vars": {"REASONRAY_MEMORY__EMBEDDING": "openai", "REASONRAY_MEMORY__MIN_SIMILARITY": "0"}},
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["example_id"] for r in records] == [f"gsm8k-{i}" for i in range(1, 7)]  # streamed in order
    assert records[0]["memory"]["retrieved"] == 0 and all(r["memory"]["retrieved"] >= 1 for r in records[1:])
    assert all(r["memory"]["stored"] >= 1 and r["memory"]["outcome"] in ("success", "failure") for r in records)
    assert (out / "data" / "chroma").is_dir()  # the run's bank lives with its results


# slow suite: the file is checked as a Serve deploy config for build_app by tests/unit/test_cluster_yaml.py, and build_app's
# application is deployed and served by every integration module
@pytest.mark.slow
def test_serve_deploy_of_the_serve_config_file_runs_the_api_on_the_cluster(dashboard_cluster, simulator, tmp_path):
    address, env = dashboard_cluster
    config = yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    port = free_port()
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    [app] = config["applications"]
    app["args"]["config_path"] = str(REPO / "config.toml")  # the file's paths and addresses, made local
    variables = app["runtime_env"]["env_vars"]
    del variables["REASONRAY_MEMORY__CHROMA_URL"]  # embedded Chroma in the data directory
    del variables["REASONRAY_AUTH__JWT_SECRET"]  # loopback here: auth off, so the operator view below is open
    variables.update(
        {
            "REASONRAY_DATA_DIR": str(tmp_path / "data"),
            "OPENAI_BASE_URL": simulator.url,
            "REASONRAY_LLM__PROVIDER": "simulated",
            "REASONRAY_MEMORY__EMBEDDING": "openai",
        }
    )
    config_file = tmp_path / "serve_config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    serve = [str(BIN / "serve")]
    deployed = subprocess.run(
        [*serve, "deploy", str(config_file), "--address", address], env=env, capture_output=True, text=True, timeout=120
    )
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 180
            while True:
                try:
                    health = client.get("/healthz")
                    if health.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the API deployed with serve deploy did not answer /healthz in 180 s"
                time.sleep(2)
            assert set(health.json()) == {"status"}  # the public probe says ok/degraded and nothing else
            details = client.get("/admin/health")  # auth is off on this cluster: the operator view is open
            assert details.status_code == 200 and details.json()["llm"]["simulated"] is True
            result = result_of(rpc(client, "reasoning.execute", {"query": "What is 17 * 23?"}))
            assert result["answer"] == "391" and result["strategy_used"] == "chain_of_thought"
            stored = result_of(rpc(client, "memory.store", {"items": [{"title": "T", "description": "D.", "content": "C."}]}))
            assert stored["stored"] and any((tmp_path / "data" / "chroma").glob("*.sqlite3"))  # the file's data directory
        status = subprocess.run([*serve, "status", "--address", address], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and yaml.safe_load(status.stdout)["applications"]["reasonray"]["status"] == "RUNNING", status.stdout
    finally:
        subprocess.run([*serve, "shutdown", "--yes", "--address", address], env=env, capture_output=True, timeout=120)
