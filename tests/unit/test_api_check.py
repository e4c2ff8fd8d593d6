"""`make check-api`: oasdiff, fed doctored copies of the baseline document,
fails on what breaks a client written against it and passes what only adds."""

from __future__ import annotations

import copy
import json

import pytest

from services.gateway import api_check

if not api_check.OASDIFF_DIR.joinpath("oasdiff").exists() and api_check.go_binary() is None:
    pytest.skip(
        "oasdiff is not installed and Go, which installs it, is missing", allow_module_level=True
    )


@pytest.fixture(scope="module")
def baseline() -> dict:
    return json.loads(api_check.BASELINE.read_text())


def _body(doc: dict, path: str, method: str = "post") -> dict:
    return doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


def _response(doc: dict, path: str, status: str = "200", method: str = "get") -> dict:
    return doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]


def _check(tmp_path, baseline: dict, change) -> tuple[bool, str]:
    revision = copy.deepcopy(baseline)
    change(revision)
    path = tmp_path / "revision.json"
    api_check.write_document(revision, path)
    return api_check.breaking(api_check.BASELINE, path)


def _new_required_field(doc: dict) -> None:
    body = _body(doc, "/v1/jobs")
    body["properties"]["region"] = {"type": "string"}
    body.setdefault("required", []).append("region")


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        (
            lambda d: d["paths"].pop("/v1/jobs/{job_id}/pause"),
            "api-path-removed-without-deprecation",
        ),
        (
            lambda d: _response(d, "/v1/runs/{run_id}")["properties"].pop("scheduled_at"),
            "response-optional-property-removed",
        ),
        (
            lambda d: _body(d, "/v1/jobs")["properties"]["priority"]["enum"].remove("low"),
            "request-property-enum-value-removed",
        ),
        (
            lambda d: d["paths"]["/v1/runs"]["get"]["parameters"][1]["schema"]["enum"].remove(
                "SKIPPED"
            ),
            "request-parameter-enum-value-removed",
        ),
        (_new_required_field, "new-required-request-property"),
        (
            lambda d: _body(d, "/v1/jobs")["properties"].pop("lease_ms"),
            "request-property-removed",
        ),
    ],
    ids=[
        "path-removed",
        "response-field-removed",
        "request-enum-value-removed",
        "query-enum-value-removed",
        "new-required-request-field",
        "request-field-removed",
    ],
)
def test_breaking_change__fails_naming_the_rule(tmp_path, baseline, change, rule):
    ok, report = _check(tmp_path, baseline, change)

    assert not ok
    assert f"[{rule}]" in report


def test_additions__pass(tmp_path, baseline):
    def add(doc: dict) -> None:
        _body(doc, "/v1/jobs")["properties"]["region"] = {"type": "string"}
        _response(doc, "/v1/runs/{run_id}")["properties"]["cell"] = {"type": "string"}
        doc["paths"]["/v1/regions"] = {"get": {"responses": {"200": {"description": "ok"}}}}

    ok, report = _check(tmp_path, baseline, add)

    assert ok, report


def test_current_document__additive_against_baseline():
    ok, report = api_check.check()

    assert ok, report
