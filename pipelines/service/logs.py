"""Structured logs: one JSON object per line, with every credential redacted before it is written.

Redaction happens in the handler's formatter, on the final line, so no code path (a message, an
argument, an exception's text, a request path someone typed a token into) can write a token, a
session cookie, a bearer header or a database password.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path

_SECRETS = [
    (re.compile(r"(csk|css)_[0-9a-f]{12}_[A-Za-z0-9_-]+"), r"\1_[redacted]"),
    (re.compile(r"(?i)(bearer\s+)[^\s\"',;]+"), r"\1[redacted]"),
    (re.compile(r"(?i)(://[^:/@\s\"]+:)[^@/\s\"]+@"), r"\1[redacted]@"),  # user:password@ in URLs
    (re.compile(r"(?i)(password=)[^&\s\"]+"), r"\1[redacted]"),
]
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def redact(text: str) -> str:
    """``text`` with every token, session cookie, bearer credential and URL password replaced."""
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text


class JsonFormatter(logging.Formatter):
    """A log record as one JSON line: time, level, logger, message and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value if isinstance(value, (int, float, bool)) or value is None else str(value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return redact(json.dumps(doc, ensure_ascii=False))


def configure(log_file: Path | None = None, level: int = logging.INFO) -> None:
    """Send the service's and uvicorn's logs, as redacted JSON lines, to stderr (and ``log_file``)."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    formatter = JsonFormatter()
    for h in handlers:
        h.setFormatter(formatter)
    for name in ("circuitstat", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True  # the service logs each request itself (app.py)
