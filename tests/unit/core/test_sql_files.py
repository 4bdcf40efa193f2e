"""The SQL files' reader (jobqueue/sql/__init__.py): headers, documentation, one name once."""

import pytest

from jobqueue import sql


def test_a_file_is_read_into_named_statements_without_their_comments():
    texts = sql.parse(
        "-- the file's own notes\n\n"
        "-- name: first_one\n-- what it does\n-- %(x)s is documented here\n"
        "SELECT %(x)s\n  FROM t -- a trailing remark stays\n\n\n"
        "-- name: second\nSELECT 2\n"
    )
    assert texts == {"first_one": "SELECT %(x)s\n  FROM t -- a trailing remark stays",
                     "second": "SELECT 2"}


def test_a_name_given_twice_or_without_text_is_refused():
    with pytest.raises(ValueError, match="named twice"):
        sql.parse("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")
    with pytest.raises(ValueError, match="no text"):
        sql.parse("-- name: a\n-- only words\n")
    with pytest.raises(ValueError, match="would hide Queries.names"):
        sql.parse("-- name: names\nSELECT 1\n")


def test_an_unknown_name_fails_loudly_and_each_database_has_its_file():
    with pytest.raises(AttributeError, match="no statement named 'nope' in jobqueue/sql/sqlite"):
        sql.sqlite.nope  # noqa: B018
    assert sql.queries("postgresql") is sql.postgresql
    assert sql.queries("sqlite") is sql.sqlite
    assert "job_claim_available" in sql.postgresql.names()
    assert dict(sql.sqlite)["clock_now"].startswith("SELECT STRFTIME(")
