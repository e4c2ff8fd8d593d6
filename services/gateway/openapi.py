"""The request and response shapes of /openapi.json, as JSON Schema.

Validation itself lives in the core (cronwheel.core.jobs and friends): these
schemas describe what the API accepts and returns for clients, docs and the
schemathesis run; they never reject a request on their own.
"""

from __future__ import annotations

from typing import Any

INSTANT = {"type": "string", "format": "date-time", "example": "2026-03-08T07:30:00.000Z"}
NULLABLE_INSTANT = {"anyOf": [INSTANT, {"type": "null"}]}
PRIORITY = {"type": "string", "enum": ["critical", "high", "normal", "low"]}
RUN_STATE = {
    "type": "string",
    "enum": [
        "PENDING",
        "RUNNING",
        "RETRY_WAIT",
        "SUCCEEDED",
        "FAILED",
        "TIMED_OUT",
        "CANCELLED",
        "SKIPPED",
    ],
}

PROBLEM = {
    "type": "object",
    "description": "RFC 9457 problem details, with a stable code and the field at fault",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string", "example": "INVALID_FIELD"},
        "field": {"type": "string", "example": "schedule.cron"},
        "cell": {"type": "string", "description": "421: the cell the tenant is homed in"},
        "api_url": {"type": "string", "description": "421: that cell's gateway"},
    },
}

RETRY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
        "initial_backoff_ms": {"type": "integer", "minimum": 0, "maximum": 86400000},
        "max_backoff_ms": {"type": "integer", "minimum": 0, "maximum": 86400000},
        "multiplier": {"type": "number", "minimum": 1, "maximum": 10},
    },
}

_SCHEDULE_EXTRAS = {
    "jitter_ms": {"type": "integer", "minimum": 0, "maximum": 3600000},
    "overlap": {"type": "string", "enum": ["allow", "skip", "buffer_one"]},
    "catchup": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "window_ms": {"type": "integer", "minimum": 0, "maximum": 604800000},
            "policy": {"type": "string", "enum": ["all", "latest"]},
            "max_runs": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
    },
}

SCHEDULE = {
    "oneOf": [
        {
            "type": "object",
            "required": ["cron"],
            "additionalProperties": False,
            "properties": {
                "cron": {"type": "string", "example": "30 2 * * *"},
                "timezone": {"type": "string", "example": "America/New_York"},
                "dst": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "gap": {"type": "string", "enum": ["shift", "skip"]},
                        "repeat": {"type": "string", "enum": ["first", "last", "both"]},
                    },
                },
                **_SCHEDULE_EXTRAS,
            },
        },
        {
            "type": "object",
            "required": ["every_ms"],
            "additionalProperties": False,
            "properties": {"every_ms": {"type": "integer", "minimum": 100}, **_SCHEDULE_EXTRAS},
        },
        {
            "type": "object",
            "required": ["at"],
            "additionalProperties": False,
            "properties": {"at": INSTANT, **_SCHEDULE_EXTRAS},
        },
    ]
}

_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}

TARGET = {
    "oneOf": [
        {
            "type": "object",
            "required": ["type", "queue"],
            "additionalProperties": False,
            "properties": {
                "type": {"const": "queue"},
                "queue": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,100}$"},
            },
        },
        {
            "type": "object",
            "required": ["type", "url"],
            "additionalProperties": False,
            "properties": {
                "type": {"const": "webhook"},
                "url": {"type": "string", "format": "uri"},
                "method": {"type": "string", "enum": ["POST", "PUT", "PATCH", "GET", "DELETE"]},
                "headers": _STRINGS,
                "timeout_ms": {"type": "integer", "minimum": 100, "maximum": 900000},
            },
        },
        {
            "type": "object",
            "required": ["type", "command"],
            "additionalProperties": False,
            "properties": {
                "type": {"const": "managed"},
                "command": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "env": _STRINGS,
                "limits": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "memory_mb": {"type": "integer", "minimum": 16, "maximum": 16384},
                        "cpu_ms": {"type": "integer", "minimum": 10, "maximum": 86400000},
                        "pids": {"type": "integer", "minimum": 1, "maximum": 4096},
                        "network": {"type": "boolean"},
                    },
                },
            },
        },
    ]
}

_JOB_FIELDS = {
    "name": {"type": "string", "minLength": 1, "maxLength": 200},
    "schedule": SCHEDULE,
    "target": TARGET,
    "payload": {"description": "any JSON, at most 256 KiB"},
    "priority": PRIORITY,
    "retry": RETRY,
    "timeout_ms": {"type": ["integer", "null"], "minimum": 100, "maximum": 604800000},
    "lease_ms": {"type": "integer", "minimum": 1000, "maximum": 3600000},
}

JOB_CREATE = {
    "type": "object",
    "required": ["name", "schedule", "target"],
    "additionalProperties": False,
    "properties": _JOB_FIELDS,
}
JOB_PATCH = {
    "type": "object",
    "additionalProperties": False,
    "description": "Fields to change; the merged job is validated as a whole",
    "properties": _JOB_FIELDS,
}

JOB = {
    "type": "object",
    "properties": {
        "job_id": {"type": "string"},
        "tenant_id": {"type": "string"},
        **_JOB_FIELDS,
        "paused": {"type": "boolean"},
        "version": {"type": "integer"},
        "next_fire_at": NULLABLE_INSTANT,
        "topic": {"type": "string", "description": "queue targets: the Kafka topic of its runs"},
        "kafka_bootstrap": {
            "type": "string",
            "description": "queue targets: the broker of the tenant's cell, where `topic` is",
        },
        "created_at": INSTANT,
        "updated_at": INSTANT,
    },
}

BACKFILL = {
    "type": "object",
    "required": ["from", "to"],
    "additionalProperties": False,
    "properties": {"from": INSTANT, "to": INSTANT},
}

TENANT_CREATE = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "cell": {"type": "string", "pattern": "^[a-z0-9-]{1,50}$"},
        "priority_classes": {"type": "array", "items": PRIORITY},
    },
}

KEY_CREATE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"label": {"type": "string", "minLength": 1, "maxLength": 100}},
}

ATTEMPT = {"type": "integer", "minimum": 1, "maximum": 2147483647}

START = {
    "type": "object",
    "required": ["worker_id"],
    "properties": {
        "worker_id": {"type": "string", "minLength": 1, "maxLength": 200},
        "attempt": {**ATTEMPT, "description": "the attempt the worker was handed; optional"},
    },
}
HEARTBEAT = {
    "type": "object",
    "required": ["attempt", "start_token"],
    "properties": {"attempt": ATTEMPT, "start_token": {"type": "string", "minLength": 1}},
}
COMPLETE = {
    "type": "object",
    "required": ["attempt", "start_token", "outcome"],
    "properties": {
        "attempt": ATTEMPT,
        "start_token": {"type": "string", "minLength": 1},
        "outcome": {"type": "string", "enum": ["SUCCEEDED", "FAILED"]},
        "result": {"description": "any JSON, at most 64 KiB"},
        "error": {"type": "string"},
        "retryable": {"type": "boolean", "default": True},
    },
}
_RUN_ID = {"type": "string", "minLength": 1}
START_BATCH = {
    "type": "object",
    "required": ["worker_id", "runs"],
    "properties": {
        "worker_id": START["properties"]["worker_id"],
        "runs": {
            "type": "array",
            "minItems": 1,
            "maxItems": 100,
            "items": {
                "type": "object",
                "required": ["run_id"],
                "properties": {"run_id": _RUN_ID, "attempt": START["properties"]["attempt"]},
            },
        },
    },
}
COMPLETE_BATCH = {
    "type": "object",
    "required": ["runs"],
    "properties": {
        "runs": {
            "type": "array",
            "minItems": 1,
            "maxItems": 100,
            "items": {
                **COMPLETE,
                "required": ["run_id", *COMPLETE["required"]],
                "properties": {"run_id": _RUN_ID, **COMPLETE["properties"]},
            },
        }
    },
}
CANCEL = {
    "type": "object",
    "properties": {"reason": {"type": "string", "maxLength": 1000}},
}

RUN = {
    "type": "object",
    "properties": {
        "run_id": {"type": "string"},
        "job_id": {"type": ["string", "null"]},
        "workflow_run_id": {"type": ["string", "null"]},
        "state": RUN_STATE,
        "attempt": {"type": "integer"},
        "scheduled_at": INSTANT,
        "created_at": INSTANT,
        "started_at": NULLABLE_INSTANT,
        "finished_at": NULLABLE_INSTANT,
        "result": {},
        "error": {"type": ["string", "null"]},
        "attempts": {"type": "array", "items": {"type": "object"}},
    },
}

PREVIEW = {
    "type": "object",
    "properties": {
        "fires": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "at": INSTANT,
                    "local": {"type": "string"},
                    "dst": {"type": ["string", "null"], "enum": [None, "gap", "repeat"]},
                },
            },
        }
    },
}


MAX_JOB_BATCH = 1000
JOB_BATCH = {
    "type": "object",
    "required": ["jobs"],
    "additionalProperties": False,
    "properties": {
        "jobs": {"type": "array", "minItems": 1, "maxItems": MAX_JOB_BATCH, "items": JOB_CREATE}
    },
}
JOB_BATCH_RESULTS = {
    "type": "object",
    "required": ["results"],
    "properties": {
        "results": {
            "type": "array",
            "description": "one per job, in order: what its own POST /v1/jobs answers",
            "items": {
                "type": "object",
                "required": ["status"],
                "properties": {
                    "status": {"type": "integer", "description": "201, or the problem's status"},
                    "job": JOB,
                    "problem": PROBLEM,
                },
            },
        }
    },
}


def page(item: dict) -> dict:
    return {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": item},
            "next_cursor": {"type": ["string", "null"]},
        },
    }


def batch_results(item_body: dict) -> dict:
    """A batch route's answer: per item, in order, the status and body (200) or
    problem (404, 409) that the single route would have answered."""
    return {
        "type": "object",
        "required": ["results"],
        "properties": {
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["run_id", "status"],
                    "properties": {
                        "run_id": {"type": "string"},
                        "status": {"type": "integer", "enum": [200, 404, 409]},
                        "body": item_body,
                        "problem": PROBLEM,
                    },
                },
            }
        },
    }


def body(schema: dict, required: bool = True) -> dict[str, Any]:
    """`openapi_extra` for a JSON request body."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": schema}},
        }
    }


def ok(schema: dict, status: int = 200, *errors: int) -> dict[int | str, dict[str, Any]]:
    """`responses` for a success shape and the problems an operation may answer."""
    out: dict[int | str, dict[str, Any]] = {
        status: {"description": "OK", "content": {"application/json": {"schema": schema}}}
    }
    for code in (401, 422, 429, *errors):
        out[code] = {
            "description": "a problem",
            "content": {"application/problem+json": {"schema": PROBLEM}},
        }
    return out


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {
        code: {
            "description": "a problem",
            "content": {"application/problem+json": {"schema": PROBLEM}},
        }
        for code in (401, 422, 429, *codes)
    }
