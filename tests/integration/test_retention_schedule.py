"""Run history's retention runs on a schedule wherever the platform runs
(issue 25): `cronwheel dev` supervises `cronwheel retention --every`, the
compose file has a service of it and Kubernetes a CronJob, each as the
tables' owner (the pass is DDL). Without one, nothing made the day
partitions ahead or dropped the days past the retention."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import yaml

from cronwheel.store import runs_daily
from services.entrypoints import DEV_RETENTION_EVERY_S, dev_retention
from tests.support.procs import ROOT
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

DEPLOY = ROOT / "deploy"


def test_dev_retention__a_pass_at_once__days_a_week_ahead__stops_on_sigterm(
    admin_database_url, tmp_path: Path
):
    argv = dev_retention()["retention"]
    assert argv[-3:] == ["retention", "--every", str(DEV_RETENTION_EVERY_S)]
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        before = set(runs_daily.days(conn))
    out = tmp_path / "retention.out"
    env = {**os.environ, "CRONWHEEL_ADMIN_DATABASE_URL": admin_database_url}
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        line = wait_for(
            lambda: next((ln for ln in out.read_text().splitlines() if "retention:" in ln), None),
            60,
            0.1,
            "the first retention pass",
        )
        assert line.startswith("retention: made "), line
        proc.send_signal(signal.SIGTERM)  # waits out --every no longer
        assert proc.wait(30) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    today = datetime.now(UTC).date()
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        after = set(runs_daily.days(conn))
    want = {today + timedelta(days=i) for i in range(8)}
    assert want <= after, sorted(want - after)
    assert f"made {len(after - before)} days" in line


def _env_names(container: dict) -> set[str]:
    return {e["name"] for e in container.get("env", [])}


def test_compose__a_retention_service__hourly__as_the_owner__no_health_check():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    svc = compose["services"]["retention"]
    assert svc["command"] == ["retention", "--every", "3600"]
    assert (
        "cronwheel:${CRONWHEEL_OWNER_PASSWORD}@"
        in svc["environment"]["CRONWHEEL_ADMIN_DATABASE_URL"]
    )
    assert svc["healthcheck"] == {"disable": True}  # it serves no HTTP
    assert svc["restart"] == "unless-stopped"


def test_k8s__a_retention_cronjob__listed__one_at_a_time__as_the_owner():
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert "retention-cronjob.yaml" in kustomization["resources"]
    job = yaml.safe_load((DEPLOY / "k8s" / "retention-cronjob.yaml").read_text())
    assert job["kind"] == "CronJob" and job["spec"]["concurrencyPolicy"] == "Forbid"
    minute, hour, *_ = job["spec"]["schedule"].split()
    assert minute.isdigit() and hour == "*"  # hourly
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["retention"]
    assert "CRONWHEEL_ADMIN_DATABASE_URL" in _env_names(container)
    assert container["envFrom"] == [{"configMapRef": {"name": "cronwheel-config"}}]
