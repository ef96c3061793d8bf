"""The modules that start a Ray cluster of their own (`ray start`, `reasonray serve`, the container entrypoint).
They run one after the other on one worker, after the integration modules were handed out (tests/conftest.py),
beside the other worker's last integration tests on the shared cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(item.fspath).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def simulator():
    server = SimulatorServer(SimulatorSettings(port=0)).start()
    yield server
    server.stop()
