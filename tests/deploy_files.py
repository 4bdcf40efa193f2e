"""The deployment files of docs/deploy/ (docs/deploying.md shows each one verbatim) as the
tests load them: read from the repository, with the few values a test must change (ports,
paths, a database name) replaced. Each replaced text must occur exactly once, so a file that
drifts from what its test expects fails loudly instead of being half-substituted; everything
else reaches the real program (nginx, PgBouncer, systemd-analyze) as an operator installs it."""

from __future__ import annotations

from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy"


def deploy_file(name: str, replace: dict[str, str] | None = None) -> str:
    text = (DEPLOY / name).read_text()
    for old, new in (replace or {}).items():
        count = text.count(old)
        assert count == 1, f"docs/deploy/{name}: {old!r} occurs {count} times, expected once"
        text = text.replace(old, new)
    return text
