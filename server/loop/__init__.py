"""The agent loop: driver, turn, step, inbox, tool pipeline, approvals; no transport."""
