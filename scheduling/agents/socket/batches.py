"""Writes of every socket of this process gathered into batches (`Batches`): start reports (lanes.py) and
heartbeats (beats.py). While one batch is being written the next gathers, so a slow database makes batches larger,
never a queue of statements; each caller gets its own items' answers, or the batch's error.

An event loop has batches of its own (`PerLoop`): a writer of another (ended) loop never runs again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")
B = TypeVar("B")

log = logging.getLogger(__name__)

# A batch written in this long or longer is logged (its size and time).
SLOW_WRITE_S = 1.0


class Batches(Generic[T, R]):
    """`write(items)` answers each item in order; it is called with what waits, at most `most` items at a time,
    after waiting `gather_s` for more to arrive (0: at once, the next batch gathering while it is written)."""

    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[list[R]]],
        *,
        gather_s: float = 0.0,
        most: int | None = None,
        name: str = "batches",
    ) -> None:
        self.write, self.gather_s, self.most, self.name = write, gather_s, most, name
        self.waiting: list[tuple[T, asyncio.Future]] = []
        self.writing: asyncio.Future | None = None

    async def submit(self, items: list[T]) -> list[R]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self.waiting += zip(items, futures, strict=True)
        if self.writing is None or self.writing.done():
            self.writing = asyncio.ensure_future(self._write_while_waiting())
        answers = await asyncio.gather(*futures, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return answers

    async def _write_while_waiting(self) -> None:
        while self.waiting:
            if self.gather_s:
                await asyncio.sleep(self.gather_s)
            cut = self.most or len(self.waiting)
            batch, self.waiting = self.waiting[:cut], self.waiting[cut:]
            began = time.monotonic()
            try:
                answers = await self.write([item for item, _ in batch])
            except asyncio.CancelledError:  # the writer itself stopped: its callers stop waiting with it
                for _, future in batch:
                    future.cancel()
                raise
            # A boundary: whatever failed, each caller waiting on the batch must hear of it, or it waits for ever;
            # it answers its agent (a retry, a refusal) or logs it, and the next batch is written.
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            took_s = time.monotonic() - began
            if took_s >= SLOW_WRITE_S:  # what an operator looks for when agents' reports lag
                log.info("%s: a batch of %d written in %.1f s", self.name, len(batch), took_s)
            for (_, future), answer in zip(batch, answers, strict=True):
                if not future.done():  # its connection closed meanwhile
                    future.set_result(answer)


class PerLoop(Generic[B]):
    """One `make()` per running event loop."""

    def __init__(self, make: Callable[[], B]) -> None:
        self.make = make
        self.of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, B] = weakref.WeakKeyDictionary()

    def get(self) -> B:
        loop = asyncio.get_running_loop()
        found = self.of.get(loop)
        if found is None:
            found = self.of[loop] = self.make()
        return found
