"""Command-line entry points. Flags are defined and parsed here only."""
