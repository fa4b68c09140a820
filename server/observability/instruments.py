"""Counters and histograms cheap enough to update on every turn, step and RPC.

`prometheus_client`'s own take a lock, check the metric and scan the buckets on every
update; these are a dict of plain numbers updated on the event loop (the only writer)
and turned into metric families when Prometheus scrapes (`Instruments.collect`, on the
endpoint's thread: a copy of each series, taken under the GIL, is consistent). Same
names, labels and buckets as the standard ones: `<name>_total` for a counter, and
`_bucket`, `_count` and `_sum` for a histogram.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class Counter:
    """A counter with labels: a number per label values."""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labels = list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...] = (), amount: float = 1) -> None:
        """Add `amount` to the series of the label values `key`."""
        values = self.values
        values[key] = values.get(key, 0) + amount

    def family(self) -> CounterMetricFamily:
        """The samples now."""
        family = CounterMetricFamily(self.name, self.help, labels=self.labels)
        for key, value in list(self.values.items()):
            family.add_metric(list(key), value)
        return family


class Histogram:
    """A histogram with labels: per label values, a count per bucket and the sum."""

    def __init__(
        self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> None:
        self.name = name
        self.help = help_text
        self.labels = list(labels)
        self.bounds = [float(b) for b in buckets]
        if self.bounds[-1] != float("inf"):
            self.bounds.append(float("inf"))
        to_text: Callable[[float], str] = floatToGoString  # untyped upstream
        self.les = [to_text(bound) for bound in self.bounds]
        """The `le` label of each bucket, as prometheus_client writes it."""
        self.series: dict[tuple[str, ...], list[float]] = {}
        """Label values -> the count of each bucket (not cumulative), then the sum."""

    def observe(self, value: float, key: tuple[str, ...] = ()) -> None:
        """Count `value` in its bucket (the first bound it does not exceed)."""
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = [0.0] * (len(self.bounds) + 1)
        series[bisect.bisect_left(self.bounds, value)] += 1
        series[-1] += value

    def family(self) -> HistogramMetricFamily:
        """The samples now: cumulative buckets, the count and the sum."""
        family = HistogramMetricFamily(self.name, self.help, labels=self.labels)
        for key, series in list(self.series.items()):
            counts = list(series)  # one copy: consistent with itself
            cumulative = 0.0
            buckets: list[tuple[str, float]] = []
            for le, count in zip(self.les, counts, strict=False):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(list(key), buckets, counts[-1])
        return family


class Instruments(Collector):
    """The counters and histograms of one registry, collected at scrape time."""

    def __init__(self) -> None:
        self.members: list[Counter | Histogram] = []

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        """A new counter, collected with the others."""
        counter = Counter(name, help_text, labels)
        self.members.append(counter)
        return counter

    def histogram(
        self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        """A new histogram, collected with the others."""
        histogram = Histogram(name, help_text, buckets, labels)
        self.members.append(histogram)
        return histogram

    def collect(self) -> Iterable[Any]:
        """Every family, read now."""
        for member in self.members:
            yield member.family()
