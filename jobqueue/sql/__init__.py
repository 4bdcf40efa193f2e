"""The statements the service runs by hand, whole and named, one file per database.

`postgresql.sql` and `sqlite.sql` beside this module hold every hand-written statement under a
`-- name: NAME` header (procrastinate's queries.sql, River's sqlc files), followed by its
documentation (`--` lines, dropped here) and its text, up to the next header. They are read
once, at import, into `Queries`: `queries(vendor).NAME` is the text to run. Nothing builds SQL
text in Python; the one value written into a text is a batch claim's LIMIT (a validated int,
jobqueue/lifecycle/pg/__init__.py, claim_statement: a plan consideration).

tests/integration/core/test_sql.py fails when a named statement is never used in the code, when
code runs SQL that is not one of these, and EXPLAINs every one on its database.
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


class Queries:
    """The named statements of one database, as attributes (an unknown name fails loudly)."""

    def __init__(self, vendor: str, texts: dict[str, str]):
        self.vendor = vendor
        self._texts = dict(texts)
        for name, text in texts.items():
            setattr(self, name, text)

    def __getattr__(self, name: str) -> str:
        raise AttributeError(f"no statement named {name!r} in jobqueue/sql/{self.vendor}.sql")

    def __iter__(self):
        return iter(self._texts.items())

    def names(self) -> list[str]:
        return list(self._texts)


def parse(text: str) -> dict[str, str]:
    """{name: statement} of a file's text: what follows each header, less its comment lines,
    up to the next header. A name may appear once."""
    parts = _HEADER.split(text)
    texts: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line.rstrip() for line in body.splitlines()
                 if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip()
        if name in texts:
            raise ValueError(f"statement {name!r} is named twice")
        if hasattr(Queries, name):
            raise ValueError(f"statement {name!r} would hide Queries.{name}")
        if not statement:
            raise ValueError(f"statement {name!r} has no text")
        texts[name] = statement
    return texts


def load(vendor: str) -> Queries:
    return Queries(vendor, parse((HERE / f"{vendor}.sql").read_text(encoding="utf-8")))


postgresql = load("postgresql")
sqlite = load("sqlite")
_BY_VENDOR = {"postgresql": postgresql, "sqlite": sqlite}


def queries(vendor: str) -> Queries:
    """The named statements of a database vendor ("postgresql" or "sqlite")."""
    return _BY_VENDOR[vendor]
