"""Logging for every EnMasse-py process, configured once, here.

Services log JSON lines (one event per line, machine-readable, ready for a collector); the CLI logs
through structlog's console renderer for people. Every line carries `service`, and `space` /
`address` where the caller binds them (`log.bind(space=..., address=...)`). Nothing prints.

Standard-library loggers (grpc, aetcd, asyncio) are routed through the same processors so that
their lines have the same shape.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

import structlog

Renderer = Literal["json", "console"]


def configure_logging(
    *, service: str, renderer: Renderer = "json", level: str | None = None
) -> None:
    """Configures structlog and the standard library's logging for this process.

    `level` defaults to $ENMASSE_LOG_LEVEL, else INFO. Safe to call more than once (the last call
    wins), which tests rely on.
    """
    level_name = (level or os.environ.get("ENMASSE_LOG_LEVEL", "INFO")).upper()
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_service(service),
    ]
    final: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if renderer == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, final],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_name)


def _add_service(service: str) -> structlog.types.Processor:
    def add_service(
        _logger: object, _method: str, event: structlog.types.EventDict
    ) -> structlog.types.EventDict:
        event.setdefault("service", service)
        return event

    return add_service
