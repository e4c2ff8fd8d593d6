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
    used = os.environ["CRONWHEEL_UPGRADE_TEMPLATE_USED"]

    def template(admin_url: str) -> str:
        # The caller checks this file: the previous release's tests did ask.
        with open(used, "a") as f:
            f.write(name + "\n")
        return name

    db.template = template
