"""Replicas over one shared store: leases, ownership, a local dev cluster."""
