"""structlog set-up: JSON lines (or console) on stderr, with the call's trace id bound from contextvars.

Library code logs events and sizes, never prompt or answer text.
"""

from __future__ import annotations

import logging
import sys

import structlog

from reasonray.kernel.config import LoggingSettings


def configure_logging(settings: LoggingSettings) -> None:
    level = logging.getLevelNamesMapping()[settings.level.upper()]
    renderer = structlog.processors.JSONRenderer() if settings.format == "json" else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
