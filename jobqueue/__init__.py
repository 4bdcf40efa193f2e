"""The job queue's core (models, lifecycle, reaper); no HTTP.

`__version__` is the server's one version: pyproject.toml reads it (the distribution's
version), and so do /healthz, GET /v1/version and the OpenAPI schema's info.version.
Releases are listed in CHANGELOG.md; between two releases it is the next one's `.dev0`.
"""

__version__ = "0.3.0.dev0"
