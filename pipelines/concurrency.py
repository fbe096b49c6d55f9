"""Running many items of a method at once: the one bounded-concurrency loop every method (the
agent, the baselines) and RL rollouts share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_bounded(
    run: Callable[..., Awaitable[T]],
    items: Iterable[tuple[Any, ...]],
    limit: int,
    on_done: Callable[[T], None] | None = None,
) -> list[T]:
    """``await run(*item)`` for every item, at most ``limit`` at once; ``on_done`` is called with
    each result as it finishes (completion order). Returns the results in input order.

    When an item (or ``on_done``) raises, every other item is cancelled and has ended before the
    exception goes on: nothing keeps running, or calling ``on_done``, after the run failed (a
    breaker stopping an eval whose retriever is down ends it at once, whatever ``limit`` is)."""
    sem = asyncio.Semaphore(limit)

    async def one(item: tuple[Any, ...]) -> T:
        async with sem:
            result = await run(*item)
        if on_done is not None:
            on_done(result)
        return result

    tasks = [asyncio.ensure_future(one(item)) for item in items]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
