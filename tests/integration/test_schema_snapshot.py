"""cronwheel/store/schema.sql is exactly what the migrations make of an empty
database, so a reader learns the schema from one file and a migration that
changes it shows in review as a change of that file."""

from __future__ import annotations

import difflib

import psycopg
import pytest

from cronwheel.store import schema_snapshot

pytestmark = pytest.mark.integration


def test_schema_sql__equals_migrated_empty_database(servers):
    with psycopg.connect(servers.database_url) as conn:
        major = conn.info.server_version // 10000
    committed = schema_snapshot.SCHEMA_FILE.read_text()
    if f"of PostgreSQL {major}," not in committed.splitlines()[5]:
        pytest.skip(
            f"schema.sql was dumped from another PostgreSQL major version than this "
            f"server's {major}: pg_dump's layout differs between majors"
        )

    migrated = schema_snapshot.dump(servers.database_url)

    diff = "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            migrated.splitlines(keepends=True),
            "cronwheel/store/schema.sql",
            "migrated empty database",
        )
    )
    assert not diff, (
        "cronwheel/store/schema.sql differs from what the migrations give: run "
        f"`{schema_snapshot.REGENERATE}` (cronwheel migrate --dump-schema) and commit it.\n"
        + diff[:6000]
    )


def test_clean__drops_session_noise_keeps_schema():
    raw = (
        "--\n-- PostgreSQL database dump\n--\n\n\\restrict abc123\n\n"
        "-- Dumped from database version 15.18\n-- Dumped by pg_dump version 15.18\n\n"
        "SET statement_timeout = 0;\nSELECT pg_catalog.set_config('search_path', '', false);\n\n"
        "--\n-- Name: t; Type: TABLE; Schema: public; Owner: -\n--\n\n"
        "CREATE TABLE public.t (\n    x integer\n);\n\n\n\n\\unrestrict abc123\n"
    )

    cleaned = schema_snapshot.clean(raw, 15)

    body = cleaned.removeprefix(schema_snapshot.HEADER.format(major=15))
    assert body == (
        "\n--\n-- Name: t; Type: TABLE; Schema: public\n--\n\n"
        "CREATE TABLE public.t (\n    x integer\n);\n"
    )
