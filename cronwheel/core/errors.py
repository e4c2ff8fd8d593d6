"""Errors the core raises for bad input or a refused request. Each carries a
stable `code` (and, for bad input, the `field` at fault); what a code means in
HTTP is the gateway's to say (services/gateway/problems.py), and the CLI prints
one readable line."""

from __future__ import annotations


class ValidationError(ValueError):
    # Callers that still pass `status` (core/jobs.py, core/workflows.py,
    # store/lifecycle.py) keep working until they drop it: it is not stored, and
    # the class attribute answers None.
    status = None

    def __init__(
        self, field: str, message: str, code: str = "INVALID_FIELD", status: object = None
    ):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code


class NotFound(LookupError):
    """The object does not exist for this tenant (another tenant's object looks the same)."""

    def __init__(self, what: str):
        super().__init__(f"{what} not found")
        self.what = what
        self.code = "NOT_FOUND"


class Conflict(RuntimeError):
    """A request that is well formed but cannot apply to the object's current state."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
