"""A whole log's load decodes its events a slice at a time (`decode_log`), the event loop
running other tasks between two, into the events a decode at once gives."""

from __future__ import annotations

import asyncio

import pytest

from agentloop.v1 import session_event_pb2 as ev
from server.kernel.content import text_content
from server.kernel.errors import SessionDamaged
from server.stores import DECODE_SLICE, FIRST_SEQ, decode_events, decode_log


def rows(count: int) -> list[tuple[int, bytes]]:
    """`count` stored (seq, bytes) rows of user messages, from the first seq."""
    return [
        (
            seq,
            ev.SessionEvent(
                seq=seq, user_message=ev.UserMessage(content=text_content(f"m{seq}"))
            ).SerializeToString(),
        )
        for seq in range(FIRST_SEQ, FIRST_SEQ + count)
    ]


async def test_a_long_log_is_decoded_a_slice_at_a_time_into_the_same_events() -> None:
    stored = rows(2 * DECODE_SLICE + 5)
    progress: list[int] = []
    decoding = True

    async def probe() -> None:  # runs whenever the decode yields
        while decoding:
            progress.append(len(progress))
            await asyncio.sleep(0)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0)  # the probe's first run
    ran_before = len(progress)
    events = await decode_log("s", FIRST_SEQ, stored)
    decoding = False
    await task
    assert events == decode_events("s", FIRST_SEQ, stored)
    assert len(progress) - ran_before == 2  # between the three slices, and only there


async def test_a_short_log_is_decoded_without_yielding() -> None:
    stored = rows(DECODE_SLICE)
    ran: list[int] = []

    async def probe() -> None:
        ran.append(1)

    task = asyncio.create_task(probe())  # would run at the decode's first yield
    events = await decode_log("s", FIRST_SEQ, stored)
    assert not ran and len(events) == DECODE_SLICE
    await task


async def test_a_gap_in_a_later_slice_is_found_where_it_is() -> None:
    stored = rows(DECODE_SLICE + 10)
    missing = FIRST_SEQ + DECODE_SLICE + 3
    del stored[missing - FIRST_SEQ]
    with pytest.raises(SessionDamaged, match=f"event {missing} is missing"):
        await decode_log("s", FIRST_SEQ, stored)
