"""The cheap counters and histograms scrape exactly as prometheus_client's own do."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram as PromHistogram
from prometheus_client.parser import text_string_to_metric_families

from server.observability.instruments import Instruments

BUCKETS = (0.001, 0.01, 0.1, 1, 10)
VALUES = (0.0, 0.0005, 0.001, 0.002, 0.01, 0.5, 1, 3.5, 10, 11, 1e9)
"""Below, on and above the bounds (a value equal to a bound counts in its bucket)."""


def samples(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):  # prometheus_client's creation time
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


def test_the_same_samples_as_prometheus_client() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    their_counter = PromCounter("x_calls", "Calls.", ["tool", "outcome"], registry=theirs)
    their_histogram = PromHistogram("x_seconds", "Time.", ["tool"], buckets=BUCKETS,
                                    registry=theirs)  # fmt: skip
    their_plain = PromHistogram("x_plain_seconds", "Time.", buckets=BUCKETS, registry=theirs)
    instruments = Instruments()
    our_counter = instruments.counter("x_calls", "Calls.", ["tool", "outcome"])
    our_histogram = instruments.histogram("x_seconds", "Time.", BUCKETS, ["tool"])
    our_plain = instruments.histogram("x_plain_seconds", "Time.", BUCKETS)
    ours.register(instruments)

    for i, value in enumerate(VALUES):
        tool = "a" if i % 3 else "b"
        their_counter.labels(tool, "ok").inc(i)
        our_counter.inc((tool, "ok"), i)
        their_histogram.labels(tool).observe(value)
        our_histogram.observe(value, (tool,))
        their_plain.observe(value)
        our_plain.observe(value)

    expected = samples(theirs)
    assert expected["x_plain_seconds_bucket{le=0.001}"] == 3  # 0, 0.0005 and 0.001
    assert expected["x_plain_seconds_count{}"] == len(VALUES)
    assert samples(ours) == expected
