"""The router: one public address for every tenant, whatever its cell (docs/cells.md)."""
