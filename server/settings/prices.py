"""The price table of the server config: what a million tokens cost per provider and model.

The console prices a session's token totals with it (`GetSessionResponse.prices`);
the server itself never charges or limits by it.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import Strict
from pydantic.dataclasses import dataclass

from server.kernel.schema import SCHEMA, rule
from server.settings.fields import Text

_CURRENCY = re.compile(r"[A-Z]{3}")


def _per_million_problem(value: float) -> str:
    if math.isfinite(value) and 0 <= value <= 1e6:
        return ""
    return "must be a number from 0 to 1000000"


PerMillion = Annotated[float, Strict(), rule(_per_million_problem)]


def _currency_problem(code: str) -> str:
    return "" if _CURRENCY.fullmatch(code) else f"{code!r} is not an ISO 4217 code (USD, EUR, …)"


Currency = Annotated[Text, rule(_currency_problem)]
Named = Annotated[Text, rule(lambda v: "" if v.strip() else "must not be empty")]


@dataclass(frozen=True, config=SCHEMA)
class PriceConfig:
    """The price of one provider's model, per million tokens of input and of output."""

    provider: Named
    """The provider name, as agents give it ("openai", "scripted", …)."""
    model: Named
    """The model name, as the request header records it."""
    input_per_million: PerMillion
    """The price of a million input tokens (cached ones included)."""
    output_per_million: PerMillion
    """The price of a million output tokens."""
    currency: Currency = "USD"
    """The ISO 4217 code of both prices."""
