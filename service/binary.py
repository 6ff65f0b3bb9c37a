"""The framed binary TCP protocol (stub until the protocols issue lands)."""

from __future__ import annotations

import asyncio
from typing import Any


async def start_binary(server: Any, host: str, port: int) -> asyncio.AbstractServer:
    loop = asyncio.get_running_loop()
    return await loop.create_server(asyncio.Protocol, host, port, reuse_address=True)
