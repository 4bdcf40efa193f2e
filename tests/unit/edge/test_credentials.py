"""Credential strings without a database: a malformed key or token is refused before any
query (this layer has no database: a query would fail the test), whatever its shape. Issuing,
resolving and revoking real rows is in tests/integration/api and tests/integration/admin."""

import pytest

from agents import credentials

PREFIX = "0123456789ab"

MALFORMED = [
    None, 42, b"jqa_0123456789ab_secret", "", "jqa", "jqa_", "jqa__secret",
    f"jqa_{PREFIX}",  # no secret part
    "jqa_0123456789a_secret",  # prefix too short
    "jqa_0123456789abc_secret",  # prefix too long
    "jqa_0123456789AB_secret",  # upper-case hex is not what the service issues
    "jqa_0123456789ag_secret",  # not hex
    f"jqa_{PREFIX}\x00_secret", "jqa_\x00123456789ab_secret",
    f"JQA_{PREFIX}_secret", f"xyz_{PREFIX}_secret",
    f"jqa_{PREFIX}_" + "s" * 200,  # longer than any credential the service issues
]


@pytest.mark.parametrize("raw", MALFORMED)
def test_a_malformed_agent_token_is_refused_without_a_query(raw):
    assert credentials.resolve_agent_token(raw) is None


@pytest.mark.parametrize("raw", MALFORMED)
def test_a_malformed_api_key_is_refused_without_a_query(raw):
    if isinstance(raw, str):
        raw = raw.replace("jqa_", "jqk_", 1)
    assert credentials.resolve_api_key(raw) is None


def test_a_token_of_the_other_kind_is_refused_without_a_query():
    assert credentials.resolve_api_key(f"jqa_{PREFIX}_secret") is None
    assert credentials.resolve_agent_token(f"jqk_{PREFIX}_secret") is None


def test_a_well_formed_credential_is_looked_up_in_the_database():
    """The other side of the tests above: a string of the right shape does reach the
    database, which this layer refuses, so the refusals above were not queries."""
    with pytest.raises(RuntimeError, match="Database access not allowed"):
        credentials.resolve_agent_token(f"jqa_{PREFIX}_secret")
