"""Tests of the agentloop server."""
