"""What every benchmark sets up first (`import _env` as the script's first import of ours): the
repository on sys.path, the offline tokenizer files beside the checkout, Ray's token auth mode (as
the Makefile exports), and quiet logs, so only the figures are printed."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import structlog

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
if "TIKTOKEN_CACHE_DIR" not in os.environ and (REPO.parent / "shared" / "tiktoken").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(REPO.parent / "shared" / "tiktoken")
os.environ.setdefault("RAY_AUTH_MODE", "token")
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
