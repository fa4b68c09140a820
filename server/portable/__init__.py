"""Sessions outside a store: a portable file to export to and import from, and moves.

The file format is `jsonl` (documented there and in the README); `transfer` copies
sessions between a store and such a file, or between two stores; `command` is the
`agentloop-server sessions ...` command line.
"""
