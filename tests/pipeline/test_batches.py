"""The agents' socket's batch writer (scheduling/agents/socket/batches.py): each caller gets its own answers, the
batch's error, or, when the writer itself is stopped, is stopped with it rather than waiting for ever."""

from __future__ import annotations

import asyncio

import pytest

from scheduling.agents.socket.batches import Batches


def test_callers_get_their_own_answers_the_batchs_error_or_the_writers_cancellation():
    async def scenario():
        written: list[list[int]] = []

        async def double(items: list[int]) -> list[int]:
            written.append(items)
            if 13 in items:
                raise ValueError("unlucky batch")
            return [i * 2 for i in items]

        batches = Batches(double, most=2)
        assert await asyncio.gather(batches.submit([1, 2, 3]), batches.submit([4])) == [[2, 4, 6], [8]]
        assert written == [[1, 2], [3, 4]]
        with pytest.raises(ValueError, match="unlucky"):
            await batches.submit([13])

        started = asyncio.Event()

        async def stuck(items: list[int]) -> list[int]:
            started.set()
            await asyncio.Event().wait()
            return items

        stopping = Batches(stuck)
        caller = asyncio.ensure_future(stopping.submit([1]))
        await asyncio.wait_for(started.wait(), timeout=5)
        stopping.writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, timeout=5)  # before the fix: a TimeoutError, the caller never told

    asyncio.run(scenario())
