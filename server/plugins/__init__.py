"""Out-of-process plugins: their connections, registry, and seam listeners."""
