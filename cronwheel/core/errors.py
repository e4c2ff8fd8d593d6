"""Errors the core raises for bad input. Each names the field at fault, so the
gateway can answer a 4xx problem+json and the CLI one readable line."""

from __future__ import annotations


class ValidationError(ValueError):
    def __init__(self, field: str, message: str, code: str = "INVALID_FIELD", status: int = 422):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code
        self.status = status


class NotFound(LookupError):
    """The object does not exist for this tenant (another tenant's object looks the same)."""

    def __init__(self, what: str):
        super().__init__(f"{what} not found")
        self.what = what
        self.code = "NOT_FOUND"
        self.status = 404


class Conflict(RuntimeError):
    """A request that is well formed but cannot apply to the object's current state."""

    def __init__(self, code: str, message: str, status: int = 409):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
