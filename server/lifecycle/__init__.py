"""The agent lifecycle: creation, resume and disposal as transactions."""
