"""The config's price table: parsed in camelCase, each bad field named."""

from __future__ import annotations

import pytest

from server.settings.config import ConfigError, parse_config
from server.settings.prices import PriceConfig

GOOD = {"provider": "openai", "model": "gpt-4o", "inputPerMillion": 2.5, "outputPerMillion": 10}


def test_a_price_table_parses_with_usd_by_default() -> None:
    config = parse_config({"prices": [GOOD, {**GOOD, "model": "gpt-4o-mini", "currency": "EUR"}]})
    assert config.prices == (
        PriceConfig("openai", "gpt-4o", 2.5, 10.0, "USD"),
        PriceConfig("openai", "gpt-4o-mini", 2.5, 10.0, "EUR"),
    )
    assert parse_config({}).prices == ()


@pytest.mark.parametrize(
    ("price", "field", "words"),
    [
        ({**GOOD, "inputPerMillion": -1}, "prices[0].inputPerMillion", "from 0 to 1000000"),
        ({**GOOD, "outputPerMillion": 1e7}, "prices[0].outputPerMillion", "from 0 to 1000000"),
        ({**GOOD, "outputPerMillion": "3"}, "prices[0].outputPerMillion", ""),
        ({**GOOD, "currency": "dollars"}, "prices[0].currency", "ISO 4217"),
        ({**GOOD, "provider": " "}, "prices[0].provider", "must not be empty"),
        ({k: v for k, v in GOOD.items() if k != "model"}, "prices[0].model", ""),
        ({**GOOD, "perToken": 1}, "prices[0].perToken", "unknown field"),
    ],
)
def test_a_bad_price_is_refused_naming_its_field(price: object, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"prices": [price]})
    assert str(info.value).startswith(f"{field}: ")
    assert words in str(info.value)


def test_a_provider_and_model_have_one_price() -> None:
    already = r"^prices\[1\]\.model: openai/gpt-4o already has a price"
    with pytest.raises(ConfigError, match=already):
        parse_config({"prices": [GOOD, {**GOOD, "currency": "EUR"}]})
