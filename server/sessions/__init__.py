"""Session logs: the log itself, group commits, request ids, repair, and reading sessions."""
