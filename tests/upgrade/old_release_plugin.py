"""Loaded with `-p old_release_plugin` into the previous release's own pytest
run (tests/upgrade/test_upgrade.py): its tests clone their databases from the
template this release migrated (CRONWHEEL_UPGRADE_TEMPLATE, expand steps only)
instead of migrating one with the previous release's migrations. Nothing else
of the previous release changes: its tests, fixtures, services and SDK run as
they were released."""

from __future__ import annotations

import os


def pytest_configure(config) -> None:
    # The previous release's tests.support.db (its tree is first on the path);
    # its conftest calls db.template when the session's template is first asked for.
    from tests.support import db

    name = os.environ["CRONWHEEL_UPGRADE_TEMPLATE"]
    db.template = lambda admin_url: name
