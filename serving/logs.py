"""The server's logs: plain text, or one JSON object per line (`--log-format json`), and the access log.

A request is followed through a fleet by its id: the middleware takes it from `x-request-id` (which a load
balancer sets or forwards) and keeps it in a context variable, so every record written while the request is
handled carries it, the access line included. Configured once, by `python -m serving` (the application);
the library code only writes to its loggers.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("bertserve_request_id", default=None)
access = logging.getLogger("bertserve.access")

# The access record's fields, in the order a text line shows them (None values are left out).
ACCESS_FIELDS = (
    "method",
    "route",
    "status",
    "task",
    "items",
    "tokens",
    "queue_ms",
    "inference_ms",
    "total_ms",
    "client",
)
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601, ms), level, logger, message, request_id when one is
    being handled, the access fields when the record has them, and the exception as one string."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id.get()
        if rid:
            entry["request_id"] = rid
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str, log_format: str) -> dict | None:
    """Set up the process's logging; returns the `log_config` to hand to uvicorn (None: uvicorn's loggers
    then propagate here, so its lines are JSON too)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT))
    # A no-op where the root logger has handlers already (an embedding application's, a test runner's).
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if log_format == "json":
        return None
    import uvicorn.config

    return uvicorn.config.LOGGING_CONFIG


def log_access(rid: str, fields: dict) -> None:
    """One access record: its message reads as a line of text, its fields become JSON keys."""
    fields = {k: v for k, v in fields.items() if v is not None}
    head = " ".join(str(fields[k]) for k in ACCESS_FIELDS[:3] if k in fields)
    rest = " ".join(f"{k}={fields[k]}" for k in ACCESS_FIELDS[3:] if k in fields)
    access.info(f"{rid} {head} {rest}", extra={"fields": fields, "request_id": rid})
