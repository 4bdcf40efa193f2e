"""What the batch commands share (jobqueue/management/command_base.py), without a database:
how a failed run reaches the caller. The runs themselves are tested against a database in
tests/integration/core (test_prune, test_commands, test_progress)."""

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobqueue.maintenance import artifact_cleaner
from jobqueue.management.command_base import BatchCommand


class Terminal(io.StringIO):
    def isatty(self):
        return True


def failing(**kwargs):
    kwargs["on_batch"](1, 5)  # one batch done, then the failure
    raise RuntimeError("storage went away")


def test_a_failed_run_is_raised_as_it_is_or_as_a_command_error_and_ends_the_progress_line(
        monkeypatch):
    command = BatchCommand()
    for failed, expected in ((None, RuntimeError), ("clean", CommandError)):
        terminal = Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        with pytest.raises(expected) as raised:
            command.run_batches("things done", {}, failing, failed=failed)
        assert terminal.getvalue().startswith("\r5 things done in 1 batch(es)")
        assert terminal.getvalue().endswith("\n")  # the line is ended, failure or not
    assert str(raised.value) == "clean failed: RuntimeError: storage went away"


def test_clean_artifacts_lets_its_failure_through_unchanged(monkeypatch):
    """clean_artifacts names no `failed`: the error is its own (a traceback), not rewrapped."""
    def broken(*args, **kwargs):
        raise RuntimeError("storage went away")

    monkeypatch.setattr(artifact_cleaner, "run_once", broken)  # the failure, not the DB layer
    with pytest.raises(RuntimeError, match="storage went away"):
        call_command("clean_artifacts", "--batch-size", "1", stdout=io.StringIO())
