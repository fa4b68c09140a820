"""The server configuration: its schema, its defaults, and what makes an agent valid."""
