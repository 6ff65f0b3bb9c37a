"""A supervisor task that raises ends the server with exit 1 and the traceback, never a silent
exit 0 (service/lifecycle.py Lifecycle.crash)."""

from __future__ import annotations

import asyncio

from ringserve.service.lifecycle import Lifecycle


async def _raises() -> None:
    raise KeyError("max_length")


async def _returns() -> None:
    return None


def test_a_raising_supervisor_is_said_with_its_traceback() -> None:
    async def main() -> tuple[str, str]:
        bad, good = asyncio.create_task(_raises()), asyncio.create_task(_returns())
        await asyncio.wait([bad, good])
        return Lifecycle.crash(bad), Lifecycle.crash(good)

    bad, good = asyncio.run(main())
    assert bad.startswith("the supervisor failed: KeyError('max_length')")
    assert "in _raises" in bad  # the traceback names where it raised
    assert good == ""


def test_a_running_or_cancelled_supervisor_is_no_crash() -> None:
    async def main() -> tuple[str, str]:
        running = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        first = Lifecycle.crash(running)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return first, Lifecycle.crash(running)

    assert asyncio.run(main()) == ("", "")
