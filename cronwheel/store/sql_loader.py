"""SQL lives in `.sql` files under `store/sql/`, as named blocks:

    -- name: claim_due_timers
    SELECT ...;

Loaded once; callers use `queries("timer")["claim_due_timers"]`. Keeping SQL out of
Python keeps it reviewable, greppable and runnable in psql as it stands.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

SQL_DIR = Path(__file__).with_name("sql")
_BLOCK = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, str]:
    names = list(_BLOCK.finditer(text))
    blocks: dict[str, str] = {}
    for i, m in enumerate(names):
        end = names[i + 1].start() if i + 1 < len(names) else len(text)
        body = text[m.end() : end].strip()
        if m.group(1) in blocks:
            raise ValueError(f"duplicate SQL block name {m.group(1)!r}")
        blocks[m.group(1)] = body.rstrip(";").strip()
    return blocks


_FRAGMENT = re.compile(r"\{\{([a-z_]+)\.([a-z0-9_]+)\}\}")


def splice(blocks: dict[str, str], sources: dict[str, dict[str, str]]) -> dict[str, str]:
    """`blocks` with each `{{module.name}}` replaced by that block of
    `sources[module]`: a part two statements share is written once and each
    still runs as one statement. Fragments of other modules are left for
    their own splice."""

    def fragment(m: re.Match) -> str:
        source = sources.get(m.group(1))
        return m.group(0) if source is None else source[m.group(2)].rstrip(";")

    return {name: _FRAGMENT.sub(fragment, sql) for name, sql in blocks.items()}


@functools.cache
def queries(module: str) -> dict[str, str]:
    return parse_blocks((SQL_DIR / f"{module}.sql").read_text())
