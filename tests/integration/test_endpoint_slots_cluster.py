"""A one-at-a-time endpoint gets one call at a time from the whole cluster: two branch runners (two processes),
each with four calls in flight, never have more than one request open at the server together."""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import ray

from reasonray.actors import NAMESPACE
from reasonray.actors.endpoint import board_name
from reasonray.actors.fanout import BranchRunner, LLMSpec
from reasonray.gateway.protocol import LLMRequest, Message
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from tests.integration.conftest import settings_for

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the branch travels to the runners by value


async def one_call(context: Any) -> str:
    completion = await context.llm.complete(LLMRequest(messages=(Message(role="user", content="[[say 12]] count"),), max_tokens=16))
    return completion.text


class OpenRequests:
    """ASGI middleware: the most chat requests open at the server at once (queued there or generating)."""

    def __init__(self, app: Any) -> None:
        self.app, self.open, self.most = app, 0, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        counted = scope["type"] == "http" and scope["path"].endswith("/chat/completions")
        if counted:
            self.open += 1
            self.most = max(self.most, self.open)
        try:
            await self.app(scope, receive, send)
        finally:
            if counted:
                self.open -= 1


def test_two_processes_together_never_exceed_a_limit_of_one(ray_cluster):
    server = SimulatorServer(SimulatorSettings(port=0, ttft_ms=150, tokens_per_second=200, max_concurrency=1))
    counter = OpenRequests(server._server.config.app)
    server._server.config.app = counter
    server.start()
    app_name = f"slots-{uuid.uuid4().hex[:6]}"
    settings = settings_for(server.url, llm={"max_concurrency": 1, "request_timeout_s": 30, "queue_timeout_s": 60})
    spec = LLMSpec(json.dumps(settings), app_name)
    runners = [BranchRunner.options(namespace=NAMESPACE).remote() for _ in range(2)]
    try:
        ray.get([r.warm.remote(spec) for r in runners], timeout=120)
        refs = [runners[i % 2].run.remote(spec, one_call, f"t{i}", "test", {}) for i in range(8)]
        results = ray.get(refs, timeout=180)
        assert all(value for value, *_ in results)
        pids = {where["pid"] for *_, where in results}
        assert len(pids) == 2  # two processes called the endpoint
        assert counter.most == 1
        board = ray.get_actor(board_name(app_name), namespace=NAMESPACE)
        stats = ray.get(board.stats.remote(server.url + "/"), timeout=30)  # the endpoint as the client names it
        assert stats["peak"] == 1 and stats["in_flight"] == 0
    finally:
        for runner in runners:
            ray.kill(runner, no_restart=True)
        try:
            ray.kill(ray.get_actor(board_name(app_name), namespace=NAMESPACE), no_restart=True)
        except ValueError:
            pass
        server.stop()
