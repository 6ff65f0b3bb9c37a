"""Structured logs: one JSON object a line on stderr, for the front-end and the workers alike."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class EventLog:
    def __init__(self, level: str = "info", stream: TextIO | None = None) -> None:
        self.level = LEVELS.get(level.lower(), logging.INFO)
        self.stream = stream or sys.stderr

    def emit(self, event: str, level: int = logging.INFO, **fields: Any) -> None:
        if level < self.level:
            return
        record = {
            "ts": round(time.time(), 3),
            "level": logging.getLevelName(level).lower(),
            "event": event,
            **fields,
        }
        try:
            self.stream.write(json.dumps(record, default=str) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not take the server down

    def info(self, event: str, **fields: Any) -> None:
        self.emit(event, logging.INFO, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.emit(event, logging.WARNING, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self.emit(event, logging.ERROR, **fields)
