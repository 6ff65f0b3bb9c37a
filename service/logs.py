"""Structured logs for the front-end; the writer lives in workers/events.py, which workers use
too (a worker never imports from `service/`)."""

from ringserve.workers.events import LEVELS, EventLog

__all__ = ["LEVELS", "EventLog"]
