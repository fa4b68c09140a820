"""The loop core: turns, steps, seams, tools and an agent's verbs; no transport."""
