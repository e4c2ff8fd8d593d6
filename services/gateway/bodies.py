"""Request bodies: read with a size cap, parse strictly, and refuse what the
database would choke on, so a bad body is a 4xx before any store call.

- over MAX_BODY_BYTES: 413 (the core then caps `payload` at 256 KiB, also 413);
- not JSON, not UTF-8, NaN/Infinity, numbers out of range, nesting too deep: 400;
- a string holding NUL or a lone surrogate (PostgreSQL stores neither): 422 naming
  the field;
- not an object where an object is required: 422 field `body`.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from fastapi import Depends, Request

from services.gateway.problems import Problem

MAX_BODY_BYTES = 512 * 1024
# POST /v1/jobs/batch carries up to 1,000 jobs; each job's own limits still hold.
MAX_BATCH_BODY_BYTES = 8 * 1024 * 1024
NOT_AN_OBJECT = "must be a JSON object"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def parse(raw: bytes) -> Any:
    """Strict JSON; Problem 400 for anything that is not."""
    try:
        return json.loads(raw, parse_constant=_reject_constant, parse_float=_finite)
    except (ValueError, RecursionError) as e:
        raise Problem(400, "MALFORMED_JSON", f"the body is not valid JSON: {e}", "body") from e


def check_strings(value: Any, root: str = "body") -> None:
    """422 naming the first string (or key) that PostgreSQL cannot store."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_text(item, path or root)
        elif isinstance(item, dict):
            for k, v in item.items():
                sub = f"{path}.{k}" if path else str(k)
                _check_text(k, sub)
                stack.append((v, sub))
        elif isinstance(item, list):
            stack.extend((v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(item))


def _check_text(text: str, field: str) -> None:
    if "\x00" in text:
        raise Problem(422, "INVALID_FIELD", "must not contain NUL characters", field)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Problem(422, "INVALID_FIELD", "must be valid Unicode", field) from e


async def read(request: Request, limit: int = MAX_BODY_BYTES) -> Any | None:
    """The parsed body, or None when there is none. Kept on request.state.body."""
    if hasattr(request.state, "body"):
        return request.state.body
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    body = parse(raw) if raw.strip() else None
    check_strings(body)
    request.state.body = body
    return body


def _too_large(limit: int) -> Problem:
    return Problem(413, "PAYLOAD_TOO_LARGE", f"the body is larger than {limit // 1024} KiB", "body")


async def json_object(request: Request) -> dict:
    return _an_object(await read(request))


async def batch_object(request: Request) -> dict:
    """A JSON object of up to MAX_BATCH_BODY_BYTES (POST /v1/jobs/batch)."""
    return _an_object(await read(request, MAX_BATCH_BODY_BYTES))


def _an_object(body: Any) -> dict:
    if body is None:
        raise Problem(422, "INVALID_FIELD", "a JSON object is required", "body")
    if not isinstance(body, dict):
        raise Problem(422, "INVALID_FIELD", NOT_AN_OBJECT, "body")
    return body


async def optional_object(request: Request) -> dict:
    """For verbs whose body is optional (pause, trigger, ...): absent means {}."""
    body = await read(request)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise Problem(422, "INVALID_FIELD", NOT_AN_OBJECT, "body")
    return body


JsonObject = Annotated[dict, Depends(json_object)]
OptionalObject = Annotated[dict, Depends(optional_object)]
BatchObject = Annotated[dict, Depends(batch_object)]
