"""End-to-end tests: a real server on a real port, driven through the generated stubs."""
