"""How long stored data is kept: the config's `retention:` section.

Every rule is off by default (0): a server keeps everything until it is deleted, as
before. With a rule on, a background sweeper (`server/lifecycle/retention.py`)
removes what it no longer keeps, a bounded batch at a time.
"""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from server.kernel.schema import SCHEMA, PositiveInt, PositiveSeconds
from server.settings.fields import NonNegativeSeconds


@dataclass(frozen=True, config=SCHEMA)
class Retention:
    """What the sweeper removes, and how often and how much at a time it works."""

    idle_session_days: NonNegativeSeconds = 0.0
    """Delete a session no agent drives, with no pending message, whose last event (or
    creation) is older than this many days; 0 keeps sessions forever."""
    disposed_session_days: NonNegativeSeconds = 0.0
    """Delete a session whose agent was disposed (and none drives it since), with no
    pending message, this many days after the disposal; 0 keeps them (the idle rule
    still applies)."""
    request_record_hours: NonNegativeSeconds = 0.0
    """Drop request records (the answers a retry with a `request_id` gets) older than
    this many hours: the retry window; 0 keeps them forever."""
    sweep_interval_seconds: PositiveSeconds = 600.0
    """Seconds between two sweeps (the first runs this long after the start)."""
    sweep_batch: PositiveInt = 100
    """Sessions examined, or request records dropped, per step; the event loop runs
    other work between two steps."""

    def on(self) -> bool:
        """Whether any rule removes anything."""
        return bool(
            self.idle_session_days or self.disposed_session_days or self.request_record_hours
        )
