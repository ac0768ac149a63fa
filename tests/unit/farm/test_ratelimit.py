"""The report limiter without a server: per process, and its fallback when Redis does not answer."""

from __future__ import annotations

import asyncio
import socket

from farm.api.ratelimit import ProcessLimiter, ReportLimiter


def test_the_process_count_holds_per_token() -> None:
    lim = ProcessLimiter()
    assert [lim.allow(1, 3) for _ in range(5)] == [True, True, True, False, False]
    assert lim.allow(2, 3)  # another token has its own count


def test_a_redis_that_does_not_answer_counts_here_and_still_limits() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lim = ReportLimiter(f"redis://127.0.0.1:{port}/0")

    async def burst() -> list[bool]:
        return [await lim.allow(7, 2) for _ in range(4)]

    assert asyncio.run(burst()) == [True, True, False, False]
    assert lim._down_until > 0  # the next reports count here without asking Redis again at once
