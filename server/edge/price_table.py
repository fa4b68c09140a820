"""The config's price table as the `Price` messages GetSession hands the console."""

from __future__ import annotations

from collections.abc import Iterable

from agentloop.v1 import agent_service_pb2 as pb
from server.settings.prices import PriceConfig


def price_messages(prices: Iterable[PriceConfig]) -> tuple[pb.Price, ...]:
    """One `Price` per configured provider and model, in the config's order."""
    return tuple(
        pb.Price(
            provider=price.provider,
            model=price.model,
            input_per_million=price.input_per_million,
            output_per_million=price.output_per_million,
            currency=price.currency,
        )
        for price in prices
    )
