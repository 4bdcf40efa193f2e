"""One version, said everywhere: /healthz, GET /v1/version, the schema's info.version, the
distributions' metadata; the landing page at / and /v1/; an old client is logged once."""

import logging
import re
import tomllib
from importlib import metadata
from pathlib import Path

import jobqueue_client
import pytest

import jobqueue

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]


def test_the_version_is_one_and_the_same_everywhere(client):
    version = jobqueue.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", version)
    assert client.get("/healthz").json()["version"] == version
    answer = client.get("/v1/version")
    assert answer.status_code == 200
    assert answer.json() == {"server": "jobqueue", "version": version, "api": "v1",
                             "min_client_version": "0.2"}
    assert client.get("/v1/schema/?format=json").json()["info"]["version"] == version
    # The installed distributions read the same sources (pyproject.toml: dynamic version).
    assert metadata.version("jobqueue") == version
    assert metadata.version("jobqueue-client") == jobqueue_client.__version__
    # The client and the server are released together, under one version.
    assert jobqueue_client.__version__ == version
    # CHANGELOG.md names it: a release, or Unreleased while it is a .dev version.
    changelog = (ROOT / "CHANGELOG.md").read_text()
    release = version.split(".dev")[0]
    assert (f"## [{release}]" in changelog) or (".dev" in version and "## [Unreleased]"
                                                 in changelog)


def test_both_distributions_are_apache_2_licensed():
    for pyproject in (ROOT / "pyproject.toml", ROOT / "clients/python/pyproject.toml"):
        assert tomllib.loads(pyproject.read_text())["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert (ROOT / "clients/python/LICENSE").read_text() == text  # the client's sdist ships it
    for name in ("jobqueue", "jobqueue-client"):
        assert metadata.metadata(name)["License-Expression"] == "Apache-2.0"


def test_version_is_public_and_ignores_credentials(client, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MIN_CLIENT_VERSION": "1.4"}
    for headers in ({}, {"HTTP_X_API_KEY": "nonsense"}, {"HTTP_AUTHORIZATION": "Bearer x"}):
        r = client.get("/v1/version", **headers)
        assert r.status_code == 200 and r.json()["min_client_version"] == "1.4"
    r = client.post("/v1/version")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"


@pytest.mark.parametrize("path", ["/", "/v1/"])
def test_the_landing_page_links_the_docs_the_schema_and_the_admin(client, path):
    page = client.get(path)
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    for link in ('href="/v1/docs/"', 'href="/v1/schema/"', 'href="/admin/"',
                 'href="/v1/.well-known/jwks.json"'):
        assert link in html
    assert jobqueue.__version__ in html
    # Each link answers (the admin with its login page).
    for target in ("/v1/docs/", "/v1/schema/", "/v1/version", "/healthz"):
        assert client.get(target).status_code == 200, target
    assert client.get("/admin/").status_code == 302
    # Under /v1/ anything else is still a JSON 404.
    missing = client.get("/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


def test_the_admins_view_site_link_reaches_the_landing_page(admin_client):
    html = admin_client.get("/admin/").content.decode()
    assert 'href="/"' in html  # "View site"
    assert admin_client.get("/").status_code == 200


def _client_logs(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "agents.clients"]


def test_an_old_client_is_logged_once_per_version(client, caplog, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MIN_CLIENT_VERSION": "0.3"}
    caplog.set_level(logging.WARNING, logger="agents.clients")
    old = "jobqueue-agent jobqueue-client/0.2.9 python/3.11.7 httpx/0.28.1"
    for _ in range(3):
        assert client.get("/v1/version", HTTP_USER_AGENT=old).status_code == 200
    [line] = _client_logs(caplog)
    assert "jobqueue-client/0.2.9 is older than 0.3 (JOBQUEUE_MIN_CLIENT_VERSION)" in line
    assert [r.levelname for r in caplog.records if r.name == "agents.clients"] == ["WARNING"]
    # Another old version: one more line; supported ones and other programs: none.
    client.get("/v1/version", HTTP_USER_AGENT="jobqueue-client/0.1.0")
    for agent in ("jobqueue-client/0.3.0", "jobqueue-client/1.0.0", "curl/8.5.0",
                  jobqueue_client.USER_AGENT, "jobqueue-client/x.y"):
        client.get("/v1/version", HTTP_USER_AGENT=agent)
    assert len(_client_logs(caplog)) == 2
    # Outside /v1/ nobody is judged.
    client.get("/healthz", HTTP_USER_AGENT="jobqueue-client/0.0.1")
    assert len(_client_logs(caplog)) == 2


def test_a_flood_of_old_versions_stops_logging(client, caplog, settings):
    from agents.middleware import MAX_LOGGED_CLIENT_VERSIONS

    settings.JOBQUEUE = {**settings.JOBQUEUE, "MIN_CLIENT_VERSION": "9.0"}
    caplog.set_level(logging.WARNING, logger="agents.clients")
    for n in range(MAX_LOGGED_CLIENT_VERSIONS + 20):
        client.get("/v1/version", HTTP_USER_AGENT=f"jobqueue-client/1.{n}")
    lines = _client_logs(caplog)
    assert len(lines) == MAX_LOGGED_CLIENT_VERSIONS + 1
    assert "no more are logged" in lines[-1]
