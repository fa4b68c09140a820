"""The server's collector settings after start-up (`server.memory.freeze_startup_heap`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_after_start_up_the_heap_is_frozen_and_young_collections_are_rarer() -> None:
    # In a child process: freezing and thresholds are process-wide.
    script = textwrap.dedent(
        """
        import gc
        from server.memory import YOUNG_THRESHOLD, freeze_startup_heap
        before = gc.get_threshold()
        kept = [object() for _ in range(10)]
        freeze_startup_heap()
        after = gc.get_threshold()
        print(gc.get_freeze_count() > 0, after == (YOUNG_THRESHOLD, *before[1:]),
              YOUNG_THRESHOLD > before[0])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["True", "True", "True"]
