"""The client's one version: pyproject.toml reads it (the distribution's version), and so do
`jobqueue-agent --version` and the User-Agent every client sends. Releases are listed in
CHANGELOG.md at the repository's root; between two releases it is the next one's `.dev0`.

The server reads `jobqueue-client/<version>` from the User-Agent and logs a client older than
its JOBQUEUE_MIN_CLIENT_VERSION (docs/api.md, "Versions")."""

import platform

import httpx

__version__ = "0.3.0.dev0"

#: Sent by every client (AgentClient, ProducerClient); a caller's own product name, when it
#: gives one, goes in front of it.
USER_AGENT = (f"jobqueue-client/{__version__} python/{platform.python_version()} "
              f"httpx/{httpx.__version__}")


def user_agent(product: str | None = None) -> str:
    return f"{product} {USER_AGENT}" if product else USER_AGENT
