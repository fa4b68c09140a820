"""The kernel, what every layer builds on; it imports nothing else of the server."""
