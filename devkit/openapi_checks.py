"""Schemathesis checks of our own, loaded by `schemathesis run` through SCHEMATHESIS_HOOKS:
what the built-in not_a_server_error and positive_data_acceptance check, with the exceptions
the document itself states; and `fuzz`, the run test_openapi.py and test_auth.py make."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import schemathesis
from ringserve.service.protocols import openapi

ROOT = Path(__file__).resolve().parent.parent


def fuzz(url: str, examples: int, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`schemathesis run` from the document at `url`: all phases, every built-in check but the
    two replaced here, one worker, nothing remembered between runs (a fresh seed each run,
    printed in its summary)."""
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "devkit.openapi_checks", "PYTHONPATH": str(ROOT)}
    cmd = [
        str(Path(sys.executable).parent / "schemathesis"), "--no-color",
        "--config-file", str(ROOT / "tests" / "schemathesis.toml"), "run", url,
        "--checks", "all",
        "--exclude-checks", "not_a_server_error,positive_data_acceptance",
        "--max-examples", str(examples),
        "--workers", "1",
        "--generation-database", "none",
        "--request-timeout", "60",
        *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)


def summary(run: subprocess.CompletedProcess[str]) -> str:
    return run.stdout[run.stdout.find("=== SUMMARY") :]


def _body(response: Any) -> dict[str, Any]:
    try:
        doc = json.loads(response.content)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


@schemathesis.check
def documented_server_errors(ctx: Any, response: Any, case: Any) -> bool | None:
    """No 5xx but a 503 or 504 that the operation documents."""
    status = response.status_code
    if status >= 500:
        documented = case.operation.definition.raw["responses"]
        if status not in (503, 504) or str(status) not in documented:
            raise AssertionError(f"undocumented server error {status}: {response.content[:300]!r}")
    return None


@schemathesis.check
def accepted_or_listed(ctx: Any, response: Any, case: Any) -> bool | None:
    """A request the document allows is not refused with 400 or 413, unless the 400's message
    is one the operation lists under x-ringserve-400-beyond-schema, or the 413 is a long text's
    (its token count in the answer: a text over max_length with truncate false)."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    status, body = response.status_code, _body(response)
    error = body.get("error", "")
    message = str(error.get("message", "") if isinstance(error, dict) else error)  # OpenAI's
    if status == 400 and not openapi.beyond_schema(case.operation.definition.raw)(message):
        raise AssertionError(f"a request the document allows was refused 400: {message!r}")
    if status == 413 and "tokens" not in body:
        raise AssertionError(f"a request the document allows was refused 413: {message!r}")
    return None
