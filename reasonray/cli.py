"""The `reasonray` command: serve the API on Ray, ask it a question, run the simulated model."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from typing import Any, NoReturn

import click
import httpx

from reasonray.evals.run import main as eval_command
from reasonray.gateway.errors import LLMConfigError
from reasonray.kernel.config import ConfigError, Settings, is_loopback_host, load_settings, require_auth_off_loopback
from reasonray.kernel.errors import error_type_of
from reasonray.kernel.logs import configure_logging
from reasonray.kernel.ports import PortCollisionError, check_instance_ports

DEFAULT_URL = "http://127.0.0.1:8000"


def _fail(message: str, code: int = 2, *, error_type: str = "usage", trace_id: str | None = None) -> NoReturn:
    """Print what failed and its type (the trace id when a run had one), then exit with `code`:
    1 when what the command ran failed, 2 for a usage or configuration error."""
    click.echo(f"error: {message}", err=True)
    click.echo(f"error_type: {error_type}" + (f"  trace_id: {trace_id}" if trace_id else ""), err=True)
    sys.exit(code)


def _port_in_use(host: str, port: int) -> str | None:
    """Why the API port cannot be ours, or None. Serve's HAProxy ingress binds with SO_REUSEPORT, so a
    second service on a port another one holds would not fail: the two would silently share its
    connections (each answering with its own tokens and data). A plain bind finds the holder."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections (TIME_WAIT) do not count
        try:
            probe.bind((host, port))
        except OSError as exc:
            return f"the API port {host}:{port} is in use ({exc.strerror}): stop what holds it, or choose another with --port"
    return None


def _load(config: str | None, overrides: dict[str, Any]) -> Settings:
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        _fail(str(exc), error_type=error_type_of(exc))
    data = settings.model_dump(mode="json")
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, key = dotted.split(".")
        data[section][key] = value
    settings = Settings.model_validate(data)
    # before anything logs: structlog's default writes to stdout, which `reasonray mcp` speaks its protocol on
    configure_logging(settings.logging)
    return settings


@click.group()
@click.version_option(package_name="reasonray")
def main() -> None:
    """ReasonRay: LLM reasoning served on Ray."""


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="config.toml to use.")
@click.option(
    "--llm",
    type=click.Choice(["auto", "simulated", "openai", "local"]),
    default=None,
    help="Model provider; default from [llm] provider (auto: simulated unless an endpoint or key is set). "
    "local: start llama.cpp's server with [llm.local]'s model (make setup-real) and answer with it.",
)
@click.option("--host", default=None, help="Address the API binds (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="API port (default 8000).")
@click.option(
    "--address",
    default="local",
    show_default=True,
    help="Ray cluster: 'local' starts one here, 'auto' joins the running one, or host:port.",
)
@click.option("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default: all).")
@click.option("--dashboard/--no-dashboard", default=True, show_default=True, help="Start the Ray dashboard.")
@click.option("--dashboard-port", type=int, default=8265, show_default=True, help="Port of the Ray dashboard (a cluster we start).")
def serve(config_path, llm, host, port, address, **cluster: Any) -> None:
    """Run the Serve API on a Ray cluster until Ctrl-C."""
    local = llm == "local"
    settings = _load(config_path, {"llm.provider": None if local else llm, "server.host": host, "server.port": port})
    if address == "local" and is_loopback_host(settings.server.host):
        # A loopback API gets a loopback node: Ray binds its own ports (GCS, raylet, workers, the
        # metrics export, the dashboard agent) on the node address, and ray.init turns
        # `_node_ip_address="127.0.0.1"` into the machine's reachable address. With this variable
        # off (Ray's default on macOS and Windows) the node address is 127.0.0.1; the cluster is
        # then one machine only, which a loopback API is anyway. Ray reads it on import.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray import serve as ray_serve

    from reasonray.serve_app import build_app

    try:  # build_app checks this too; here it fails before a simulator starts
        require_auth_off_loopback(settings.server.host, settings)
    except ConfigError as exc:
        _fail(str(exc), error_type="config_error")
    if address == "local" and (busy := _port_in_use(settings.server.host, settings.server.port)):
        _fail(busy, error_type="config_error")
    settings, simulator, local_model = _start_provider(settings, local)
    try:
        try:
            app = build_app({"settings": settings.model_dump(mode="json")})
        except (ConfigError, LLMConfigError) as exc:
            _fail(str(exc), error_type=error_type_of(exc))
        context = _start_cluster(settings, address, cluster)
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            ray_serve.start(http_options={"host": settings.server.host, "port": settings.server.port})
            ray_serve.run(app, name="reasonray", route_prefix="/")
            _banner(settings, context, simulator, local_model)
            stop.wait()
        finally:
            click.echo("stopping...")
            # Deleting the application first lets its replicas answer the requests in flight through a proxy that is
            # still up ([server] shutdown_timeout_s); serve.shutdown() alone kills the proxies with those requests.
            try:
                ray_serve.delete("reasonray")
            except Exception as exc:  # a cluster already gone: nothing left to drain
                click.echo(f"  could not drain the application ({type(exc).__name__}: {exc})", err=True)
            ray_serve.shutdown()
            ray.shutdown()
    finally:  # the model server serve started, whatever failed
        for child in (simulator, local_model):
            if child:
                child.stop()


def _start_provider(settings: Settings, local: bool) -> tuple[Settings, Any, Any]:
    """The settings pointed at the model server serve starts, if any: llama.cpp for `--llm local`, the
    simulator for a simulated provider without a base_url; with the simulator and the local model (or None)."""
    from reasonray.gateway.simulator.server import SimulatorServer

    if local:
        return _start_local_model(settings)
    if settings.resolved_provider() != "simulated" or settings.llm.base_url:
        return settings, None, None
    simulator = SimulatorServer(_simulator_settings(settings.llm.simulator)).start()
    update = {"provider": "simulated", "base_url": simulator.url, "provider_reason": settings.provider_reason()}
    return settings.model_copy(update={"llm": settings.llm.model_copy(update=update)}), simulator, None


def _simulator_settings(section: Any, **given: Any) -> Any:
    """[llm.simulator] (`section`) as the simulated model's settings, each option `given` (not None) over its key."""
    from reasonray.gateway.simulator.server import SimulatorSettings

    fields = {**section.model_dump(), **{k: v for k, v in given.items() if v is not None}}
    return SimulatorSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def _start_cluster(settings: Settings, address: str, cluster: dict[str, Any]) -> Any:
    """ray.init, joining `address` or starting a local cluster with serve's --num-cpus/--dashboard* options."""
    import ray

    from reasonray.actors.environment import ray_environment

    # Cluster-wide options only apply to a cluster we start; joining one takes it as it is.
    own: dict[str, Any] = {}
    os.umask(0o077)  # files the cluster we start writes (event logs, sessions, Chroma): 0600 / 0700
    if address == "local":
        for name, value in ray_environment(settings).items():
            os.environ.setdefault(name, value)
        try:  # a port set in the environment that another process holds: that process would answer for us
            check_instance_ports(os.environ)
        except PortCollisionError as exc:
            _fail(str(exc), error_type="config_error")
        own = {"include_dashboard": cluster.pop("dashboard"), "dashboard_host": "127.0.0.1", **cluster}
    return ray.init(address=address, namespace="reasonray", log_to_driver=False, **own)


def _banner(settings: Settings, context: Any, simulator: Any, local_model: Any) -> None:
    """What serve prints once the API answers: the model, the auth state and every address."""
    import ray

    base = f"http://{settings.server.host}:{settings.server.port}"
    model = (
        "the SIMULATED model (not a real LLM; see docs/simulator.md)"
        if settings.resolved_provider() == "simulated"
        else f"{settings.llm.model} at {settings.llm.base_url or 'OpenAI'}"
    )
    click.echo(f"ReasonRay is serving on a Ray cluster, answering with {model}.")
    click.echo(f"  provider   {settings.provider_reason()}")
    if settings.haproxy_ingress():
        click.echo("  ingress    HAProxy ([server] fast_ingress)")
    elif settings.server.fast_ingress:
        click.echo("  ingress    Serve's proxy: HAProxy ([server] fast_ingress) needs [auth] on a host name (docs/security.md#ports)")
    if settings.auth.enabled:
        click.echo("  auth       ON: every endpoint but /healthz needs `Authorization: Bearer <token>` (reasonray token create)")
    else:
        click.echo("  !!! AUTHENTICATION IS OFF: anyone who can reach this port can call every method !!!")
        click.echo("  !!! loopback only; set [auth] jwt_secret to turn it on (docs/security.md)        !!!")
    click.echo(f"  JSON-RPC   POST {base}/rpc")
    click.echo(f"  API docs   {base}/docs")
    click.echo(f"  health     {base}/healthz")
    click.echo(f"  A2A        {base}/.well-known/agent-card.json  (docs/interop.md)")
    click.echo(f"  Prometheus {base}/metrics  (every node's; docs/operations.md#get-metrics-on-the-api-port)")
    if context.dashboard_url:
        click.echo(f"  dashboard  http://{context.dashboard_url}")
    node = next((n for n in ray.nodes() if n.get("Alive") and n["NodeID"] == ray.get_runtime_context().get_node_id()), None)
    if node is not None:
        click.echo(f"  metrics    http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics  (docs/operations.md#metrics)")
    if simulator:
        click.echo(f"  simulated model  {simulator.url}")
    if local_model:
        click.echo(f"  local model  {local_model.url}  (llama.cpp, pid {local_model.process.pid if local_model.process else '?'})")
    click.echo(f'Try:  {sys.argv[0]} ask "What is 17 * 23?" --url {base}     (Ctrl-C stops)')


def _start_local_model(settings: Settings) -> tuple[Settings, None, Any]:
    """Start [llm.local]'s model server and point [llm] at it: keyless, its alias as the model name."""
    from reasonray.gateway.local_model import LocalModelServer, model_path

    click.echo("starting the local model server (llama.cpp)...")
    try:
        server = LocalModelServer(settings.llm.local).start()
    except LLMConfigError as exc:
        _fail(str(exc), error_type=error_type_of(exc))
    update = {
        "provider": "openai",
        "base_url": server.url,
        "model": server.model,
        "api_key_required": False,
        "provider_reason": f"openai: `--llm local` started llama.cpp's server at {server.url} ([llm.local])",
    }
    # its model file is here: prompts count as the server counts them (its own template; a --chat_format is another)
    if settings.llm.tokenizer == "auto" and not settings.llm.local.chat_format:
        update["tokenizer"] = str(model_path(settings.llm.local))
    return settings.model_copy(update={"llm": settings.llm.model_copy(update=update)}), None, server


@main.command()
@click.argument("question")
@click.option("--strategy", default=None, help="Strategy to use (default: the agent's or the server's).")
@click.option("--agent", default=None, help="Run as this registered agent (agent_id).")
@click.option("--strategy-config", default=None, help="Strategy config as JSON, e.g. '{\"max_tokens\": 512}'.")
@click.option("--trace", is_flag=True, help="Also print the run's events.")
@click.option("--reasoning-effort", type=click.Choice(["low", "medium", "high"]), default=None, help="How hard a reasoning model thinks.")
@click.option("--thinking-budget", type=click.IntRange(min=0), default=None, help="Most tokens each model call may spend thinking.")
@click.option("--show-reasoning", is_flag=True, help="Also print the model's thinking behind the answer.")
@click.option("--url", default=DEFAULT_URL, show_default=True, envvar="REASONRAY_URL", help="Where the API runs.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the answer.")
def ask(question, agent, strategy_config, trace, show_reasoning, url, timeout, **options: Any) -> None:
    """Ask the running service a question through reasoning.execute."""
    from reasonray.client import Client, ReasonRayError

    config = None
    if strategy_config:
        try:
            config = json.loads(strategy_config)
        except json.JSONDecodeError as exc:
            _fail(f"--strategy-config is not valid JSON: {exc}")
    try:
        with Client(url, timeout=timeout) as rr:
            # strategy, reasoning_effort and thinking_budget are execute's keywords of the same name
            result = rr.execute(question, strategy_config=config, agent_id=agent, include_trace=trace, **options)
    except httpx.HTTPError as exc:
        _fail(
            f"cannot reach ReasonRay at {url} ({type(exc).__name__}: {exc}). Is `reasonray serve` running?",
            1,
            error_type="service_unreachable",
        )
    except ReasonRayError as error:
        data = error.data or {}
        click.echo(f"error {error.code}: {error.message}", err=True)
        click.echo(f"error_type: {data.get('error_type', 'unknown')}  trace_id: {data.get('trace_id', '-')}", err=True)
        if data:
            click.echo(json.dumps(data, indent=2), err=True)
        sys.exit(1)
    if show_reasoning and result.get("reasoning"):
        click.echo(f"<thinking>\n{result['reasoning']}\n</thinking>")
    click.echo(result["answer"])
    metrics = {k: v for k, v in result["metrics"].items() if k != "strategy_specific"}
    click.echo(f"\nstrategy: {result['strategy_used']} (chosen by {result['resolution']['strategy_decided_by']})")
    click.echo(f"metrics:  {json.dumps(metrics)}")
    click.echo(f"specific: {json.dumps(result['metrics']['strategy_specific'])}")
    click.echo(f"trace_id: {result['trace_id']}")
    if trace:
        click.echo(json.dumps(result["trace"], indent=2))


def _listed(context: Any, param: Any, kinds: str | None) -> tuple[str, ...] | None:
    """A comma-separated option's values; None when it is not given."""
    return tuple(k.strip() for k in kinds.split(",") if k.strip()) if kinds else None


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="config.toml whose [llm.simulator] gives the defaults.")
@click.option("--host", default=None, help="Bind address [default: 127.0.0.1].")
@click.option("--port", default=8001, show_default=True, type=int)
@click.option("--ttft-ms", type=float, default=None, help="Simulated time to first token [default: 0].")
@click.option("--tokens-per-second", type=float, default=None, help="Simulated generation speed [default: 0, instant].")
@click.option("--fault-rate", type=float, default=None, help="Share of requests that fail on purpose [default: 0].")
@click.option("--fault-kinds", default=None, callback=_listed, help="Comma-separated: 429, 500, timeout [default: all three].")
@click.option("--seed", type=int, default=None, help="Seed of the model's choices [default: 0].")
@click.option("--hang-s", default=30.0, show_default=True, help="How long a timeout fault keeps the client waiting.")
@click.option("--disobey", "disobey_rate", type=float, default=None, help="Share of replies that disobey as real models do [default: 0].")
@click.option("--disobey-kinds", default=None, callback=_listed, help="Comma-separated: prose, ramble, tools [default: all three].")
@click.option(
    "--tokenizer", type=click.Choice(["cl100k_base", "digits"]), default=None, help="Token counting [default: digits when disobeying]."
)
@click.option("--max-concurrency", type=int, default=None, help="Requests generated at once, 0: no limit [default: 1 when disobeying].")
@click.option("--context-length", type=int, default=None, help="Context window in tokens [default: 4096 when disobeying, else 131072].")
def sim(config_path, port, context_length, **options: Any) -> None:
    """Run the simulated OpenAI-compatible model (docs/simulator.md)."""
    from reasonray.gateway.simulator.server import run

    try:  # every other option (host, ttft_ms, fault_kinds, seed, ...) is the simulator setting of its own name
        settings = _simulator_settings(_load(config_path, {}).llm.simulator, port=port, context_length=context_length or None, **options)
    except ValueError as exc:  # a rate, a kind or a size the simulator refuses
        _fail(str(exc), error_type="invalid_params")
    disobedient = f", disobeying {settings.disobey_rate:.0%} of replies" if settings.disobedient else ""
    click.echo(f"simulated model (not a real LLM) on http://{settings.host}:{port}/v1{disobedient}")
    run(settings)


@main.command("mcp")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="config.toml to use.")
@click.option(
    "--llm", type=click.Choice(["auto", "simulated", "openai"]), default=None, help="Model provider; default from [llm] provider."
)
@click.option(
    "--token",
    envvar="REASONRAY_TOKEN",
    default=None,
    help="Bearer token every tool call runs as (required when [auth] is configured; env REASONRAY_TOKEN).",
)
def mcp_command(config_path, llm, token) -> None:
    """Serve MCP over stdio for desktop clients (Claude Desktop, Cursor): the API in this process, no Ray (docs/mcp.md)."""
    import asyncio

    from reasonray.api.app import in_process_application
    from reasonray.api.surfaces.mcp_server import StdioCaller, serve_stdio
    from reasonray.kernel.errors import ReasonRayError, UnauthenticatedError

    settings = _load(config_path, {"llm.provider": llm})
    try:
        caller = StdioCaller(settings, token)
        principal = caller.principal()  # a missing, expired or forged token: refused before anything starts
    except UnauthenticatedError as exc:
        given = "" if not token else "the token of --token / REASONRAY_TOKEN was refused: "
        _fail(given + str(exc), error_type=error_type_of(exc))
    try:
        application = in_process_application(settings)
    except (ConfigError, LLMConfigError, ReasonRayError) as exc:  # a missing token, key, model or memory server: say which
        _fail(str(exc), error_type=error_type_of(exc))
    if principal is not None:
        click.echo(f"reasonray mcp: authenticated as {principal.sub!r} (roles: {', '.join(principal.roles) or 'none'})", err=True)
    elif token:
        click.echo("reasonray mcp: [auth] is not configured; the token is ignored and calls run unguarded", err=True)
    closing = application.client.close if application.client is not None else None
    asyncio.run(serve_stdio(application.dispatcher, caller, closing=closing))


@main.group()
def events() -> None:
    """The event logs under <data_dir>/events (docs/operations.md#event-logs)."""


@events.command()
@click.option("--before", required=True, type=click.DateTime(formats=["%Y-%m-%d"]), help="Delete the logs of UTC days before this.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="config.toml whose data_dir holds the logs.")
def purge(before, config_path) -> None:
    """Delete the event logs of every day before --before (YYYY-MM-DD)."""
    from reasonray.kernel.retention import purge as purge_logs

    settings = _load(config_path, {})
    events_dir = settings.data_dir / "events"
    swept = purge_logs(events_dir, before.date())
    click.echo(
        f"deleted {swept.deleted_files} event log(s) ({swept.deleted_bytes} bytes) from before {before.date()} in {events_dir}; "
        f"{swept.kept_files} kept"
    )


main.add_command(eval_command, "eval")  # `reasonray eval` is `python -m reasonray.evals.run`


@main.group()
def token() -> None:
    """Bearer tokens for local use (docs/security.md)."""


@token.command("create")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="config.toml to use.")
@click.option("--sub", required=True, help="The principal (a user or an agent).")
@click.option("--role", "roles", multiple=True, required=True, help="A role ([auth.roles.<name>]); repeat for several.")
@click.option("--ttl", type=int, default=None, help="Lifetime in seconds (default: [auth] default_ttl_s).")
@click.option("--agent-id", default=None, help="Bind the principal to this AgentCard: it runs as that agent only.")
def token_create(config_path, sub, roles, ttl, agent_id) -> None:
    """Mint an HS256 token with the configured [auth] jwt_secret; prints the token alone."""
    from reasonray.api.access.auth import mint_token

    auth = _load(config_path, {}).auth
    if not auth.jwt_secret:
        _fail("no [auth] jwt_secret configured: set it in config.toml or REASONRAY_AUTH__JWT_SECRET", error_type="config_error")
    unknown = sorted(set(roles) - set(auth.roles))
    if unknown:
        _fail(f"unknown role(s) {unknown}; configured roles: {sorted(auth.roles)}")
    if ttl is not None and ttl <= 0:
        _fail("--ttl must be a positive number of seconds")
    ttl_s = ttl or auth.default_ttl_s
    click.echo(mint_token(auth.jwt_secret, sub, list(roles), ttl_s, issuer=auth.issuer, audience=auth.audience, agent_id=agent_id))
