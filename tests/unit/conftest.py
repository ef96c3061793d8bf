"""Unit tests run on what they set up themselves: nothing of the caller's `REASONRAY_*` environment
leaks into the settings they load, and docs examples run from the checkout's root as a reader would."""

from __future__ import annotations

import os

import pytest

from tests.docs_examples import REPO


@pytest.fixture(autouse=True)
def _no_reasonray_environment(monkeypatch):
    for name in [n for n in os.environ if n.startswith("REASONRAY_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def in_repo(monkeypatch):
    """Run from the repository root, where the docs' relative paths point."""
    monkeypatch.chdir(REPO)
    return REPO
