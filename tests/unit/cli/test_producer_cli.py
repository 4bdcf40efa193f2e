"""`jobqueue` (jobqueue_client/producer_cli.py) without a server: how arguments and settings
are read, what each command sends, what it prints (text and --json) and its exit status for
every kind of answer. An httpx.MockTransport stands in for the service; the same commands
against a real server and agent are tests/e2e/test_cli.py."""

import argparse
import io
import json

import httpx
import pytest
from jobqueue_client import producer_cli
from jobqueue_client.cli_output import OPTION_OF_FIELD

from tests.unit.agent.scripted import ScriptedServer

KEY = "jqk_0123456789ab_secret"
JOB = {"id": "j1", "status": "queued", "attempt": 0, "max_attempts": 3, "priority": 0,
       "group": None, "external_id": "", "created_at": "2030-01-01T00:00:00Z",
       "job_agent_id": "ag"}


class Server(ScriptedServer):
    def __init__(self, *answers):
        super().__init__(*answers)
        self.seen: list[httpx.Request] = []

    def record(self, request):
        self.seen.append(request)

    def body(self, n=0):
        return json.loads(self.seen[n].content)


@pytest.fixture
def env(monkeypatch):
    for name in ("JOBQUEUE_URL", "JOBQUEUE_SERVER", "JOBQUEUE_WORKSPACE", "JOBQUEUE_API_KEY",
                 "JOBQUEUE_AGENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JOBQUEUE_URL", "http://jq.test")
    monkeypatch.setenv("JOBQUEUE_WORKSPACE", "ws")
    monkeypatch.setenv("JOBQUEUE_API_KEY", KEY)
    return monkeypatch


def run(argv, *answers, stdin=None, monkeypatch=None):
    server = Server(*answers)
    code = producer_cli.main([str(a) for a in argv], transport=httpx.MockTransport(server))
    return code, server


def job(**fields):
    return {**JOB, **fields}


# --- arguments and settings ----------------------------------------------------------------


def _every_parser(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _every_parser(sub)


def test_every_option_and_command_has_help_text():
    parsers = list(_every_parser(producer_cli.build_parser()))
    # jobqueue, jobs + 10 verbs, groups + 2, schedules + 7, flows + 1, rate-limits + 4,
    # fairness-keys + 4
    assert len(parsers) == 35
    for parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):  # its commands have help
                assert all(c.help for c in action._choices_actions), parser.prog
                continue
            assert action.help and action.help != argparse.SUPPRESS, (parser.prog, action.dest)
        assert parser.description, parser.prog


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        producer_cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("jobqueue ")


@pytest.mark.parametrize("argv", [
    ["--url", "http://other.test", "--workspace", "w2", "--api-key", "jqk_b", "jobs", "get", "j1"],
    ["jobs", "get", "j1", "--url", "http://other.test", "--workspace", "w2", "--api-key",
     "jqk_b"],
])
def test_connection_options_go_before_or_after_the_command_and_beat_the_environment(env, argv):
    code, server = run(argv, (200, JOB))
    assert code == 0
    [request] = server.seen
    assert str(request.url) == "http://other.test/v1/workspaces/w2/jobs/j1"
    assert request.headers["X-API-Key"] == "jqk_b"
    assert request.headers["User-Agent"].startswith("jobqueue-cli/")


def test_json_before_or_after_the_command(env, capsys):
    for argv in (["--json", "jobs", "get", "j1"], ["jobs", "get", "j1", "--json"]):
        assert run(argv, (200, JOB))[0] == 0
        assert json.loads(capsys.readouterr().out) == JOB


def test_a_usage_error_is_one_json_object_with_json(env, capsys):
    with pytest.raises(SystemExit) as exc:
        producer_cli.main(["--json", "jobs", "list", "--limit", "-3"])
    assert exc.value.code == 2
    error = json.loads(capsys.readouterr().err)
    assert error["exit_code"] == 2 and error["error"]["code"] == "usage"
    assert "--limit" in error["error"]["message"] and "--help" in error["error"]["message"]
    with pytest.raises(SystemExit) as exc:  # without --json: argparse's usage text
        producer_cli.main(["jobs", "list", "--limit", "-3"])
    assert exc.value.code == 2 and "usage: jobqueue jobs list" in capsys.readouterr().err


def test_the_agents_variable_for_the_url_is_read_too(env):
    env.delenv("JOBQUEUE_URL")
    env.setenv("JOBQUEUE_SERVER", "http://agent-side.test")
    _, server = run(["jobs", "get", "j1"], (200, JOB))
    assert server.seen[0].url.host == "agent-side.test"


def test_missing_settings_name_the_variables_to_set(env, capsys):
    for name in ("JOBQUEUE_URL", "JOBQUEUE_WORKSPACE", "JOBQUEUE_API_KEY"):
        env.delenv(name)
    code, server = run(["jobs", "get", "j1"])
    assert code == 2 and server.seen == []
    err = capsys.readouterr().err
    assert "set JOBQUEUE_URL (or --url)" in err
    assert "JOBQUEUE_WORKSPACE (or --workspace)" in err
    assert "JOBQUEUE_API_KEY (or --api-key)" in err


def test_a_url_that_is_not_http_is_a_usage_error(env, capsys):
    env.setenv("JOBQUEUE_URL", "127.0.0.1:8000")
    assert run(["jobs", "list"])[0] == 2
    assert "must be an http:// or https:// URL" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["jobs", "create", "--agent", "ag", "--max-attempts", "0"], "must be at least 1"),
    (["jobs", "create", "--agent", "ag", "--priority", "high"], "not an integer: 'high'"),
    (["jobs", "create", "--agent", "ag", "--expires-at", "tomorrow"], "not an ISO 8601 time"),
    (["jobs", "create", "--agent", "ag", "--unique-states", "queued,done"],
     "a comma-separated list of: pending, queued, in_progress"),
    (["jobs", "create", "--agent", "ag", "--on-conflict", "merge"], "invalid choice: 'merge'"),
    (["jobs", "create", "--agent", "ag", "--debounce-seconds", "0"], "must be at least 1"),
    (["jobs", "create", "--agent", "ag", "--depends-on", ","], "give at least one job id"),
    (["flows"], "the following arguments are required"),
    (["jobs", "list", "--status", "done"], "invalid choice: 'done'"),
    (["jobs", "list", "--limit", "5", "--all"], "not allowed with argument --limit"),
    (["jobs", "logs", "j1", "--interval", "0"], "must be positive"),
    (["jobs"], "the following arguments are required"),
])
def test_bad_arguments_exit_2_naming_the_option(env, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        producer_cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# --- jobs create ---------------------------------------------------------------------------


def test_create_sends_every_option_it_was_given(env, capsys, tmp_path):
    context = tmp_path / "ctx.json"
    context.write_text('{"password": "hunter2"}')
    code, server = run(["jobs", "create", "--agent", "ag", "--config", '{"timeout_seconds": 60}',
                        "--context", context, "--priority", "-2", "--max-attempts", "4",
                        "--delay-seconds", "0", "--retry-backoff-seconds", "7",
                        "--max-runtime-seconds", "600", "--expires-at", "2030-01-02T03:04:05",
                        "--external-id", "e-1", "--group", "run 1", "--hold",
                        "--idempotency-key", "k-1", "--json", "--", "make", "-j", "2"],
                       (201, job(status="pending")))
    assert code == 0
    assert server.body() == {
        "job_agent_id": "ag", "job_agent_config": {"timeout_seconds": 60,
                                                   "command": ["make", "-j", "2"]},
        "dispatch_context": {"password": "hunter2"}, "priority": -2, "max_attempts": 4,
        "delay_seconds": 0, "retry_backoff_seconds": 7, "max_runtime_seconds": 600,
        "expires_at": "2030-01-02T03:04:05+00:00", "external_id": "e-1", "group": "run 1",
        "hold": True}
    assert server.seen[0].headers["Idempotency-Key"] == "k-1"
    out = capsys.readouterr()
    assert json.loads(out.out)["status"] == "pending" and "hunter2" not in out.out + out.err


def test_create_sends_the_unique_key_and_its_options(env, capsys):
    code, server = run(["jobs", "create", "--agent", "ag", "--unique-key", "nightly",
                        "--unique-states", "queued, pending", "--on-conflict", "replace",
                        "--debounce-seconds", "30", "--debounce-max-seconds", "300"],
                       (201, job(unique_key="nightly", deduplicated=False)))
    assert code == 0
    assert server.body() == {"job_agent_id": "ag", "unique_key": "nightly",
                             "unique_states": ["queued", "pending"], "on_conflict": "replace",
                             "debounce_seconds": 30, "debounce_max_seconds": 300}
    out = capsys.readouterr()
    assert "unique_key" in out.out and "nightly" in out.out
    assert "no job created" not in out.err


def test_create_sends_the_concurrency_key_and_limit_and_shows_them(env, capsys):
    code, server = run(["jobs", "create", "--agent", "ag", "--concurrency-key", "deploy:prod",
                        "--concurrency-limit", "3"],
                       (201, job(concurrency_key="deploy:prod", concurrency_limit=3,
                                 deduplicated=False)))
    assert code == 0
    assert server.body() == {"job_agent_id": "ag", "concurrency_key": "deploy:prod",
                             "concurrency_limit": 3}
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["concurrency_key", "deploy:prod"] in rows and ["concurrency_limit", "3"] in rows
    # Without the options nothing is sent; a plain job shows neither row.
    code, server = run(["jobs", "create", "--agent", "ag"],
                       (201, job(concurrency_key=None, concurrency_limit=None)))
    assert code == 0 and server.body() == {"job_agent_id": "ag"}
    assert "concurrency" not in capsys.readouterr().out


def test_create_sends_the_rate_limit_key_and_shows_it(env, capsys):
    code, server = run(["jobs", "create", "--agent", "ag", "--rate-limit-key", "partner/api"],
                       (201, job(rate_limit_key="partner/api", deduplicated=False)))
    assert code == 0
    assert server.body() == {"job_agent_id": "ag", "rate_limit_key": "partner/api"}
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["rate_limit_key", "partner/api"] in rows
    code, server = run(["jobs", "create", "--agent", "ag"], (201, job(rate_limit_key=None)))
    assert code == 0 and server.body() == {"job_agent_id": "ag"}
    assert "rate_limit_key" not in capsys.readouterr().out
    answer = (400, {"code": "validation_error", "detail": "Invalid input.",
                    "fields": {"rate_limit_key": ["rate_limit_key must be 1 to 255 printable "
                                                  "characters."]}})
    assert run(["jobs", "create", "--agent", "ag", "--rate-limit-key", "x"], answer)[0] == 2
    assert "--rate-limit-key: rate_limit_key must be" in capsys.readouterr().err


def test_create_sends_the_fairness_key_and_shows_it(env, capsys):
    code, server = run(["jobs", "create", "--agent", "ag", "--fairness-key", "tenant/7"],
                       (201, job(fairness_key="tenant/7", deduplicated=False)))
    assert code == 0
    assert server.body() == {"job_agent_id": "ag", "fairness_key": "tenant/7"}
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["fairness_key", "tenant/7"] in rows
    code, server = run(["jobs", "create", "--agent", "ag"], (201, job(fairness_key=None)))
    assert code == 0 and server.body() == {"job_agent_id": "ag"}
    assert "fairness_key" not in capsys.readouterr().out
    answer = (400, {"code": "validation_error", "detail": "Invalid input.",
                    "fields": {"fairness_key": ["fairness_key must be 1 to 255 printable "
                                                "characters."]}})
    assert run(["jobs", "create", "--agent", "ag", "--fairness-key", "x"], answer)[0] == 2
    assert "--fairness-key: fairness_key must be" in capsys.readouterr().err


def test_a_refused_concurrency_field_names_its_option(env, capsys):
    answer = (400, {"code": "validation_error", "detail": "Invalid input.",
                    "fields": {"concurrency_limit": ["concurrency_limit applies only with a "
                                                     "concurrency_key."]}})
    code, _ = run(["jobs", "create", "--agent", "ag", "--concurrency-limit", "2"], answer)
    assert code == 2
    assert "--concurrency-limit" in capsys.readouterr().err


def test_create_says_when_a_live_job_answered_instead(env, capsys):
    code, _ = run(["jobs", "create", "--agent", "ag", "--unique-key", "nightly"],
                  (200, job(status="in_progress", deduplicated=True)))
    assert code == 0
    assert "no job created" in capsys.readouterr().err


def test_create_wait_on_a_deduplicated_create_waits_for_the_live_job(env, capsys):
    code, _ = run(["jobs", "create", "--agent", "ag", "--unique-key", "k", "--wait"],
                  (200, job(deduplicated=True)), (200, job(status="successful")))
    assert code == 0
    assert "found job j1" in capsys.readouterr().err


def test_create_sends_only_what_was_given_and_reads_the_agent_from_the_environment(env,
                                                                                   capsys):
    env.setenv("JOBQUEUE_AGENT", "ag-env")
    code, server = run(["jobs", "create"], (201, JOB))
    assert code == 0 and server.body() == {"job_agent_id": "ag-env"}
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["id", "j1"] and "status" in text


def test_create_reads_the_context_or_the_config_from_stdin(env, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO('{"a": 1}'))
    _, server = run(["jobs", "create", "--agent", "ag", "--context", "-"], (201, JOB))
    assert server.body()["dispatch_context"] == {"a": 1}
    monkeypatch.setattr("sys.stdin", io.StringIO('{"command": ["true"]}'))
    _, server = run(["jobs", "create", "--agent", "ag", "--config", "-"], (201, JOB))
    assert server.body()["job_agent_config"] == {"command": ["true"]}


def test_create_quiet_prints_the_id_alone(env, capsys):
    assert run(["jobs", "create", "--agent", "ag", "-q"], (201, JOB))[0] == 0
    assert capsys.readouterr().out == "j1\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["jobs", "create"], "set --agent ID (or JOBQUEUE_AGENT)"),
    (["jobs", "create", "--agent", "ag", "--timeout", "5"], "--timeout applies only with --wait"),
    (["jobs", "create", "--agent", "ag", "--config", "-", "--context", "-"],
     "only one of --config and --context can read stdin"),
    (["jobs", "create", "--agent", "ag", "--config", '{"command": ["a"]}', "--", "b"],
     "either in --config or after --, not both"),
    (["jobs", "create", "--agent", "ag", "--config", "{nope"], "--config: the value is not JSON"),
    (["jobs", "create", "--agent", "ag", "--context", "/nonexistent/ctx.json"],
     "--context: cannot read '/nonexistent/ctx.json': No such file or directory"),
    (["jobs", "artifacts", "j1", "--name", "a.txt"], "--name applies only with --download"),
])
def test_create_mistakes_are_usage_errors_that_send_nothing(env, capsys, argv, message):
    code, server = run(argv)
    assert code == 2 and server.seen == []
    err = capsys.readouterr().err
    assert message in err and err.startswith("jobqueue: error: ")


def test_a_context_that_is_not_an_object_is_refused_without_quoting_it(env, capsys, tmp_path):
    secret = tmp_path / "ctx.json"
    secret.write_text('["hunter2"]')
    code, _ = run(["jobs", "create", "--agent", "ag", "--context", secret])
    err = capsys.readouterr().err
    assert code == 2 and "holds a JSON list; it must be an object" in err
    assert "hunter2" not in err
    secret.write_text('{"password": hunter2}')
    assert run(["jobs", "create", "--agent", "ag", "--context", secret])[0] == 2
    err = capsys.readouterr().err
    assert "is not JSON (line 1, column 14" in err and "hunter2" not in err


def test_create_wait_long_polls_until_the_end_and_exits_by_status(env, capsys):
    code, server = run(["jobs", "create", "--agent", "ag", "--wait", "--json"], (201, JOB),
                       (200, job(status="failure", message="exit 3")))
    assert code == 1
    assert server.seen[1].url.params["wait_seconds"] == "50"
    out = capsys.readouterr()
    assert json.loads(out.out)["status"] == "failure" and out.err == ""  # --json: no notes
    code, _ = run(["jobs", "create", "--agent", "ag", "--wait"], (201, JOB),
                  (200, job(status="successful")))
    out = capsys.readouterr()
    assert code == 0 and "created job j1 (queued); waiting for it to end" in out.err


# --- reading jobs --------------------------------------------------------------------------


def test_wait_answers_at_once_for_an_ended_job(env):
    code, server = run(["jobs", "wait", "j1"], (200, job(status="cancelled")))
    assert code == 1 and len(server.seen) == 1 and "wait_seconds" not in server.seen[0].url.params


def test_wait_timeout_exits_7_with_the_job_as_last_seen(env, capsys):
    running = job(status="in_progress", attempt=1)
    code, _ = run(["jobs", "wait", "j1", "--timeout", "0", "--json"], (200, running),
                  (200, running))
    assert code == 7
    out = capsys.readouterr()
    assert json.loads(out.out)["status"] == "in_progress"
    error = json.loads(out.err)
    assert error["exit_code"] == 7 and error["error"]["code"] == "timeout"
    assert "jobqueue jobs wait j1" in error["error"]["message"]


def test_an_interrupted_wait_says_the_job_goes_on(env, capsys):
    def interrupted(request):
        raise KeyboardInterrupt

    code = producer_cli.main(["jobs", "wait", "j1"], transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json=job(status="queued")) if not r.url.params
        else interrupted(r)))
    assert code == 130
    assert "stopped waiting; job j1 goes on" in capsys.readouterr().err


def test_get_shows_the_job_its_attempts_and_with_events_its_timeline(env, capsys):
    detail = job(status="failure", attempt=1, message="line 1\n" + "x\n" * 20,
                 result={"ok": False}, dispatch_context_keys=["password"],
                 claim=None, job_agent_config={"command": ["make"]},
                 attempts=[{"number": 1, "claimed_at": "t1", "ended_at": "t2",
                            "outcome": "failure", "message": "exit 3"}],
                 events=[{"kind": "stale_write_refused", "attempt": 1, "actor": "agent:a",
                          "detail": {"code": "job_finished"}, "created_at": "t3", "count": 3,
                          "last_at": "t4"}])
    assert run(["jobs", "get", "j1"], (200, detail))[0] == 0
    text = capsys.readouterr().out
    assert "result        {\"ok\": false}" in text and "context_keys  password" in text
    assert "… (11 more lines: --json has them)" in text
    assert "attempts:\nN  CLAIMED_AT" in text and "events:" not in text
    assert run(["jobs", "get", "j1", "--events"], (200, detail))[0] == 0
    assert "stale_write_refused x3" in capsys.readouterr().out


def test_list_follows_the_pages_up_to_the_limit_and_says_there_is_more(env, capsys):
    page1 = {"results": [job(id="a"), job(id="b"), job(id="c")],
             "next": "http://elsewhere/v1/workspaces/ws/jobs?cursor=c2", "previous": None}
    page2 = {"results": [job(id="d")], "next": None, "previous": None}
    code, server = run(["jobs", "list", "--limit", "2", "--status", "queued", "--group", "g",
                        "--agent", "ag"], (200, page1))
    assert code == 0
    assert dict(server.seen[0].url.params) == {"status": "queued", "group": "g",
                                               "job_agent_id": "ag", "page_size": "3"}
    out = capsys.readouterr()
    assert [line.split()[0] for line in out.out.splitlines()] == ["ID", "a", "b"]
    assert "(the newest 2; --limit N or --all for more)" in out.err
    code, server = run(["jobs", "list", "--all", "--json"], (200, page1), (200, page2))
    assert [j["id"] for j in json.loads(capsys.readouterr().out)] == ["a", "b", "c", "d"]
    assert server.seen[1].url.host == "jq.test" and server.seen[1].url.params["cursor"] == "c2"


def test_an_empty_list_is_an_empty_array_or_a_note(env, capsys):
    empty = {"results": [], "next": None, "previous": None}
    assert run(["jobs", "list", "--json"], (200, empty))[0] == 0
    assert json.loads(capsys.readouterr().out) == []
    assert run(["jobs", "list"], (200, empty))[0] == 0
    out = capsys.readouterr()
    assert out.out == "" and "no jobs match" in out.err


# --- logs ----------------------------------------------------------------------------------


def log(data: bytes, attempt: int, length: int):
    return (200, data, {"X-Log-Attempt": str(attempt), "X-Log-Length": str(length)})


def test_logs_print_the_bytes_as_they_are(env, capsysbinary):
    code, server = run(["jobs", "logs", "j1", "--attempt", "2"], log(b"caf\xc3\xa9\n", 2, 6))
    assert code == 0 and capsysbinary.readouterr().out == b"caf\xc3\xa9\n"
    assert dict(server.seen[0].url.params) == {"attempt": "2"}


def test_logs_follow_goes_on_to_later_attempts_and_stops_at_the_end(env, capsysbinary):
    code, server = run(
        ["jobs", "logs", "j1", "--follow", "--interval", "0.01"],
        (200, job(status="in_progress", attempt=1)),
        log(b"one\n", 1, 4),
        (200, job(status="in_progress", attempt=2)),  # a retry started
        log(b"", 1, 4),  # attempt 1's log is read to its end first
        log(b"two\n", 2, 4),
        (200, job(status="successful", attempt=2)),
        log(b"", 2, 4))
    assert code == 0
    out = capsysbinary.readouterr()
    assert out.out == b"one\ntwo\n" and b"--- attempt 2 ---" in out.err
    reads = [dict(r.url.params) for r in server.seen if r.url.path.endswith("/log")]
    assert reads == [{}, {"attempt": "1", "offset": "4"}, {"attempt": "2"},
                     {"attempt": "2", "offset": "4"}]
    polls = [dict(r.url.params) for r in server.seen if r.url.path.endswith("/j1")]
    assert polls == [{}, {"wait_seconds": "1"}, {"wait_seconds": "1"}]


def test_logs_follow_json_prints_one_line_a_chunk_and_exits_by_status(env, capsys):
    code, _ = run(["jobs", "logs", "j1", "--follow", "--json", "--interval", "0.01"],
                  (200, job(status="in_progress", attempt=1)), log(b"a\n", 1, 2),
                  (200, job(status="failure", attempt=1)), log(b"b\n", 1, 4))
    assert code == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["attempt"], d["offset"], d["text"]) for d in lines] == [(1, 0, "a\n"),
                                                                       (1, 2, "b\n")]


# --- artifacts and groups ------------------------------------------------------------------


def test_artifacts_with_an_odd_name_from_the_server_are_not_saved(env, capsys, tmp_path):
    listed = {"results": [{"name": "../evil", "size": 1, "sha256": "x", "attempt": 1}]}
    code, server = run(["jobs", "artifacts", "j1", "--download", tmp_path / "out"],
                       (200, listed))
    assert code == 5 and len(server.seen) == 1
    assert not (tmp_path / "evil").exists() and list((tmp_path / "out").iterdir()) == []
    assert "not a file name: not saved" in capsys.readouterr().err


def test_no_artifacts_is_a_note_in_text_and_an_empty_array_in_json(env, capsys):
    assert run(["jobs", "artifacts", "j1"], (200, {"results": []}))[0] == 0
    out = capsys.readouterr()
    assert out.out == "" and "no published artifacts" in out.err
    assert run(["jobs", "artifacts", "j1", "--json"], (200, {"results": []}))[0] == 0
    assert json.loads(capsys.readouterr().out) == []


def test_groups(env, capsys):
    group = {"group": "run 1", "counts": {"queued": 2, "successful": 1, "failure": 0},
             "finished": False, "cancelled_at": None}
    code, server = run(["groups", "get", "run 1"], (200, group))
    assert code == 0 and server.seen[0].url.raw_path == b"/v1/workspaces/ws/groups/run%201"
    text = capsys.readouterr().out
    assert text.startswith("group     run 1\nfinished  no") and "  queued       2" in text
    code, server = run(["groups", "cancel", "run 1", "--reason", "stop"], (200, {"cancelled": 1}))
    assert code == 0 and server.body() == {"reason": "stop"}
    assert capsys.readouterr().out == "group run 1: cancelled 1 job; it takes no new jobs\n"


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(("answers", "code", "message"), [
    ([(401, {"code": "authentication_failed", "detail": "Invalid key."})], 4,
     "set JOBQUEUE_API_KEY (or --api-key) to a valid API key of workspace ws"),
    ([(403, {"code": "permission_denied", "detail": "No."})], 4,
     "not an agent token (jqa_…)"),
    ([(404, {"code": "not_found", "detail": "Not found."})], 3,
     "job j1 not found (not_found): check it, and that JOBQUEUE_WORKSPACE"),
    ([(429, {"code": "throttled", "detail": "Slow down."}, {"Retry-After": "3"})], 5,
     "try again after 3 s"),
    ([(503, {"code": "database_unavailable", "detail": "Busy."})] * 3, 5,
     "the server failed (503 database_unavailable: Busy.)"),
    ([httpx.ConnectError("refused")] * 3, 5,
     "no answer from http://jq.test (ConnectError: refused): check JOBQUEUE_URL"),
    ([(200, b"<html>")], 5, "invalid_response"),
])
def test_error_answers_map_to_exit_statuses_and_say_what_to_change(env, capsys, answers, code,
                                                                   message):
    assert run(["jobs", "get", "j1"], *answers)[0] == code
    out = capsys.readouterr()
    assert out.out == "" and message in out.err and KEY not in out.err


def test_conflicts_exit_6_with_a_hint(env, capsys):
    answer = (409, {"code": "job_finished", "detail": "The job has already reached a terminal "
                                                      "status."})
    assert run(["jobs", "cancel", "j1"], answer)[0] == 6
    assert "`jobqueue jobs requeue ID` runs it again" in capsys.readouterr().err
    answer = (409, {"code": "group_cancelled", "detail": "The group was cancelled."})
    assert run(["jobs", "create", "--agent", "ag", "--group", "g"], answer)[0] == 6
    assert "use a new --group" in capsys.readouterr().err
    answer = (409, {"code": "unique_key_conflict", "detail": "The live job j0 with this "
                    "unique_key belongs to another job agent than this create's."})
    assert run(["jobs", "create", "--agent", "ag", "--unique-key", "k", "--on-conflict",
                "replace"], answer)[0] == 6
    err = capsys.readouterr().err
    assert "(unique_key_conflict)" in err and "put the agent in the key" in err


def test_a_refused_field_names_the_option_that_sets_it(env, capsys):
    answer = (400, {"code": "validation_error", "detail": "Invalid input.",
                    "fields": {"max_runtime_seconds": ["Ensure this value is less than or "
                                                       "equal to 86400."],
                               "job_agent_id": ["No such job agent in this workspace."]}})
    assert run(["jobs", "create", "--agent", "ag", "--max-runtime-seconds", "99999", "--json"],
               answer)[0] == 2
    error = json.loads(capsys.readouterr().err)
    assert error["exit_code"] == 2 and error["error"]["status"] == 400
    assert "--max-runtime-seconds: Ensure this value" in error["error"]["message"]
    assert "--agent: No such job agent" in error["error"]["message"]
    assert set(error["error"]["fields"]) == {"max_runtime_seconds", "job_agent_id"}
    answer = (422, {"code": "idempotency_key_reused", "detail": "Key reused."})
    assert run(["jobs", "create", "--agent", "ag", "--idempotency-key", "k"], answer)[0] == 2
    assert "use a new --idempotency-key" in capsys.readouterr().err


def test_every_field_of_post_jobs_has_its_option():
    """A field the server names in a 400 is translated to the option that sets it."""
    create = next(p for p in _every_parser(producer_cli.build_parser())
                  if p.prog.endswith("jobs create"))
    options = {o for a in create._actions for o in a.option_strings}
    fields = {"job_agent_id", "job_agent_config", "dispatch_context", "priority",
              "max_attempts", "delay_seconds", "retry_backoff_seconds", "max_runtime_seconds",
              "expires_at", "external_id", "group", "hold", "idempotency_key", "labels",
              "concurrency_key", "concurrency_limit", "rate_limit_key", "fairness_key"}
    for field in fields:
        assert OPTION_OF_FIELD[field].split()[0] in options, field


def test_logs_follow_never_asks_for_a_longer_wait_than_the_server_allows(env, capsysbinary):
    """A long --interval pauses up to it between reads, but each long-poll asks for at most
    the client's max_wait_seconds (50, the server's default bound: beyond is a 400)."""
    code, server = run(["jobs", "logs", "j1", "--follow", "--interval", "120"],
                       (200, job(status="in_progress", attempt=1)), log(b"", 1, 0),
                       (200, job(status="successful", attempt=1)), log(b"x", 1, 1))
    assert code == 0 and capsysbinary.readouterr().out == b"x"
    assert server.seen[2].url.params["wait_seconds"] == "50"


def test_an_agent_token_given_as_the_api_key_is_named_as_such(env, capsys):
    env.setenv("JOBQUEUE_API_KEY", "jqa_0123456789ab_agent")
    answer = (401, {"code": "authentication_failed", "detail": "Invalid key."})
    assert run(["jobs", "list"], answer)[0] == 4
    err = capsys.readouterr().err
    assert "JOBQUEUE_API_KEY (or --api-key) holds an agent token (jqa_…)" in err
    assert "jqa_0123456789ab_agent" not in err


def test_a_list_is_printed_as_its_pages_come(env, capsys):
    """`--all` holds no list in memory: the first page is out before the second is asked
    for (here the second fails: what came stays printed, the exit status says it failed)."""
    page1 = {"results": [job(id="a", group="a very long group name")], "previous": None,
             "next": "http://jq.test/v1/workspaces/ws/jobs?cursor=c2"}
    failed = (503, {"code": "server_error", "detail": "Down."})
    assert run(["jobs", "list", "--all"], (200, page1), failed, failed, failed)[0] == 5
    out = capsys.readouterr()
    assert out.out.splitlines()[1].split() == ["a", "queued", "0/3", "0",
                                               "2030-01-01T00:00:00Z", "a", "very", "long",
                                               "group", "name"]
    assert "the server failed (503 server_error: Down.)" in out.err
    assert run(["jobs", "list", "--all", "--json"], (200, page1), failed, failed, failed)[0] == 5
    assert capsys.readouterr().out.startswith('[\n  {"id": "a"')


def test_logs_json_is_one_document_however_many_reads_the_log_takes(env, capsys):
    """A read answers at most 16 MiB; a longer log (a raised JOBQUEUE_MAX_LOG_BYTES) takes
    several, and --json still prints one document with all of it."""
    code, server = run(["jobs", "logs", "j1", "--json"], log(b"abc", 1, 5), log(b"de", 1, 5))
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"job_id": "j1", "attempt": 1, "offset": 0,
                                                   "length": 5, "text": "abcde"}
    assert [dict(r.url.params) for r in server.seen] == [{}, {"attempt": "1", "offset": "3"}]


# --- the rarer paths -----------------------------------------------------------------------


class Interrupting(Server):
    """Ctrl-C while a request is on its way (KeyboardInterrupt is no Exception: raised here)."""

    def __call__(self, request):
        if self.answers and self.answers[0] is KeyboardInterrupt:
            self.answers.pop(0)
            raise KeyboardInterrupt
        return super().__call__(request)


def test_ctrl_c_while_following_a_log_says_the_job_goes_on(env, capsys):
    server = Interrupting((200, job(status="in_progress", attempt=1)), KeyboardInterrupt)
    code = producer_cli.main(["jobs", "logs", "j1", "--follow"],
                             transport=httpx.MockTransport(server))
    assert code == 130
    assert "stopped following the log; the job goes on" in capsys.readouterr().err


def test_ctrl_c_during_any_other_command_is_exit_status_130(env, capsys):
    server = Interrupting(KeyboardInterrupt)
    assert producer_cli.main(["jobs", "get", "j1"], transport=httpx.MockTransport(server)) == 130
    assert "interrupted" in capsys.readouterr().err


def test_download_into_a_directory_that_cannot_be_made_is_a_usage_error(env, capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    listed = {"results": [{"name": "a.txt", "size": 1, "sha256": "x", "attempt": 1}]}
    code, server = run(["jobs", "artifacts", "j1", "--download", tmp_path / "file" / "out"],
                       (200, listed))
    assert code == 2 and len(server.seen) == 1
    assert "--download: cannot make the directory" in capsys.readouterr().err


def test_download_of_a_job_without_artifacts_saves_nothing_and_says_so(env, capsys, tmp_path):
    code, _ = run(["jobs", "artifacts", "j1", "--download", tmp_path / "out"],
                  (200, {"results": []}))
    assert code == 0 and list((tmp_path / "out").iterdir()) == []
    assert "has no published artifacts: nothing saved" in capsys.readouterr().err


def test_an_expiry_with_its_own_offset_keeps_it():
    assert producer_cli._expires_at("2030-01-02T03:04:05+02:00") == "2030-01-02T03:04:05+02:00"
    assert producer_cli._expires_at("2030-01-02T03:04:05") == "2030-01-02T03:04:05+00:00"


def test_help_text_with_line_breaks_keeps_them():
    formatter = producer_cli._Formatter("jobqueue")
    assert formatter._fill_text("one\n  two\n", 80, "  ") == "  one\n    two\n"
    assert formatter._fill_text("one two", 80, "  ") == "  one two"


def test_the_version_from_a_source_tree_is_unknown(monkeypatch):
    def missing(name):
        raise producer_cli.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(producer_cli.importlib.metadata, "version", missing)
    assert producer_cli.version() == "unknown"


def test_get_of_a_claimed_job_shows_its_lease(env, capsys):
    claim = {"attempt": 2, "lease_state": "active", "claim_expires_at": "t9",
             "heartbeat_at": None}
    assert run(["jobs", "get", "j1"], (200, job(status="in_progress", attempt=2,
                                                claim=claim)))[0] == 0
    assert "attempt 2, lease active until t9 (last heartbeat none yet)" in \
        capsys.readouterr().out


def test_logs_follow_of_a_retry_whose_first_attempt_printed_nothing_has_no_separator(
        env, capsysbinary):
    code, _ = run(["jobs", "logs", "j1", "--follow", "--interval", "0.01"],
                  (200, job(status="in_progress", attempt=1)),
                  log(b"", 1, 0),
                  (200, job(status="in_progress", attempt=2)),
                  log(b"", 1, 0),
                  log(b"two\n", 2, 4),
                  (200, job(status="successful", attempt=2)),
                  log(b"", 2, 4))
    assert code == 0
    out = capsysbinary.readouterr()
    assert out.out == b"two\n" and b"--- attempt" not in out.err


def test_a_reader_that_went_away_ends_the_command_quietly(env, monkeypatch, tmp_path):
    """`jobqueue jobs list | head`: BrokenPipeError is exit status 0, and what is left to
    print goes to /dev/null (here: a file standing in for the pipe)."""
    with open(tmp_path / "stdout", "w") as stdout:
        monkeypatch.setattr(producer_cli.sys, "stdout", stdout)
        code, _ = run(["jobs", "get", "j1"], BrokenPipeError(32, "Broken pipe"))
    assert code == 0


def test_create_sends_its_dependencies(env, capsys):
    code, server = run(["jobs", "create", "--agent", "ag", "--depends-on", "p1, p2"],
                       (201, job(status="pending", depends_on=["p1", "p2"],
                                 waiting_on=["p2"])))
    assert code == 0
    assert server.body() == {"job_agent_id": "ag", "depends_on": ["p1", "p2"]}
    out = capsys.readouterr().out
    assert "depends_on" in out and "waiting_on" in out and "p1, p2" in out


def test_flows_create_reads_a_file_or_stdin(env, capsys, tmp_path, monkeypatch):
    import io

    flow = {"jobs": [{"ref": "extract", "job_agent_id": "ag"},
                     {"ref": "load", "job_agent_id": "ag", "depends_on_refs": ["extract"]}]}
    made = {"extract": job(id="e1"), "load": job(id="l1", status="pending")}
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(flow))
    code, server = run(["flows", "create", path], (201, {"jobs": made}))
    assert code == 0 and server.body() == flow
    assert capsys.readouterr().out.splitlines() == ["extract  e1  queued", "load  l1  pending"]
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(flow)))
    code, _ = run(["--json", "flows", "create", "-"], (201, {"jobs": made}))
    assert code == 0 and json.loads(capsys.readouterr().out) == {"jobs": made}


def test_flows_create_wants_a_list_of_jobs(env, capsys, tmp_path):
    path = tmp_path / "flow.json"
    path.write_text('{"jobs": {}}')
    code, server = run(["flows", "create", path])
    assert code == 2 and not server.seen
    assert "FILE must hold" in capsys.readouterr().err


# --- labels and explain ------------------------------------------------------------------------


def test_create_for_labels_sends_them_instead_of_the_agent(env, capsys):
    env.setenv("JOBQUEUE_AGENT", "ag-env")  # --label wins over the variable
    code, server = run(["jobs", "create", "--label", "gpu", "--label", "region=eu"],
                       (201, job(job_agent_id=None, labels=["gpu", "region=eu"])))
    assert code == 0 and server.body() == {"labels": ["gpu", "region=eu"]}
    assert "labels      gpu, region=eu" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        producer_cli.main(["jobs", "create", "--label", "gpu", "--agent", "ag"])
    assert exc.value.code == 2
    assert "--agent: not allowed with argument --label" in capsys.readouterr().err
    code, server = run(["jobs", "create", "--label", "gpu"],
                       (400, {"code": "validation_error", "detail": "Invalid input.",
                              "fields": {"labels": ["Each label: 1 to 63 characters."]}}))
    assert code == 2 and "--label: Each label" in capsys.readouterr().err


EXPLAINED = {"status": "pending", "claimable": False, "reasons": [
    {"code": "waiting_on_dependencies", "detail": "The job waits for its dependencies.",
     "waiting_on": ["p1", "p2"]},
    {"code": "no_matching_agent_online", "detail": "None of them has been seen."}],
    "agents": {"matching": 2, "online": 0}}


def test_explain_prints_the_status_each_reason_and_the_agents(env, capsys):
    code, server = run(["jobs", "explain", "j1"], (200, EXPLAINED))
    assert code == 0
    assert str(server.seen[0].url) == "http://jq.test/v1/workspaces/ws/jobs/j1/explain"
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == ["job        j1", "status     pending", "claimable  no",
                                    "agents     2 matching, 0 online"]
    assert "  waiting_on_dependencies   The job waits for its dependencies." in out
    assert "waiting_on: p1, p2" in out
    assert "  no_matching_agent_online  None of them has been seen." in out
    assert run(["jobs", "explain", "j1", "--json"], (200, EXPLAINED))[0] == 0
    assert json.loads(capsys.readouterr().out) == EXPLAINED


@pytest.mark.parametrize(("reasons", "says"), [
    ([], "yes: the next claim of a matching agent takes it"),
    ([{"code": "no_matching_agent", "detail": "No agent has them.", "labels": ["gpu"]}],
     "yes: a matching agent's claim would take it (see the reasons)"),
])
def test_explain_says_whether_a_claim_takes_it(env, capsys, reasons, says):
    answer = {"status": "queued", "claimable": True, "reasons": reasons,
              "agents": {"matching": 0, "online": 0}}
    assert run(["jobs", "explain", "j1"], (200, answer))[0] == 0
    out = capsys.readouterr().out
    assert f"claimable  {says}" in out
    assert ("reasons    none" in out) == (not reasons)
    assert ("labels: gpu" in out) == bool(reasons)


def test_explain_prints_a_rate_limited_reasons_fields(env, capsys):
    answer = {"status": "queued", "claimable": False, "agents": {"matching": 1, "online": 1},
              "reasons": [
                  {"code": "rate_limited", "detail": "Its rate limit holds it back.",
                   "key": "api", "count": 10, "period_seconds": 60, "claimed": 10,
                   "until": "2030-01-01T00:01:00Z"},
                  {"code": "rate_limited", "detail": "Its key has no limit.", "key": "gone",
                   "count": None, "period_seconds": None, "claimed": None, "until": None}]}
    assert run(["jobs", "explain", "j1"], (200, answer))[0] == 0
    out = capsys.readouterr().out
    assert "  rate_limited  Its rate limit holds it back." in out
    for line in ("key: api", "count: 10", "period_seconds: 60", "claimed: 10",
                 "until: 2030-01-01T00:01:00Z", "until: none", "count: none"):
        assert line in out, line
    assert "None" not in out


def test_explain_of_an_unknown_job_exits_3(env, capsys):
    code, _ = run(["jobs", "explain", "nope"], (404, {"code": "not_found", "detail": "No."}))
    assert code == 3 and "job nope not found" in capsys.readouterr().err


# --- rate limits ---------------------------------------------------------------------------

LIMIT = {"key": "partner api/v2", "count": 10, "period_seconds": 60,
         "created_at": "2030-01-01T00:00:00Z", "updated_at": "2030-01-02T00:00:00Z"}
LIMIT_PATH = b"/v1/workspaces/ws/rate-limits/partner%20api%2Fv2"


def test_rate_limits_set_puts_the_limit_and_shows_it(env, capsys):
    code, server = run(["rate-limits", "set", "partner api/v2", "--count", "10",
                        "--period-seconds", "60"], (200, LIMIT))
    assert code == 0
    [request] = server.seen
    assert (request.method, request.url.raw_path) == ("PUT", LIMIT_PATH)
    assert server.body() == {"count": 10, "period_seconds": 60}
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split(None, 1) == ["key", "partner api/v2"]
    assert rows[1].split(None, 1) == ["limit", "10 claims per 60 s"]
    code, _ = run(["rate-limits", "set", "partner api/v2", "--count", "10",
                   "--period-seconds", "60", "--json"], (200, LIMIT))
    assert code == 0 and json.loads(capsys.readouterr().out) == LIMIT


@pytest.mark.parametrize("argv", [
    ["rate-limits", "set", "k", "--count", "10"],
    ["rate-limits", "set", "k", "--period-seconds", "10"],
    ["rate-limits", "set", "k", "--count", "0", "--period-seconds", "10"],
    ["rate-limits", "set", "k", "--count", "x", "--period-seconds", "10"],
    ["rate-limits", "set", "--count", "1", "--period-seconds", "10"],
    ["rate-limits", "get"],
    ["rate-limits", "delete"],
])
def test_rate_limit_mistakes_are_usage_errors_that_send_nothing(env, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        run(argv)
    assert exc.value.code == 2 and "usage:" in capsys.readouterr().err


def test_a_refused_rate_limit_names_its_options(env, capsys):
    answer = (400, {"code": "validation_error", "detail": "Invalid input.",
                    "fields": {"count": ["Must be an integer from 1 to 100000."],
                               "period_seconds": ["Must be an integer from 1 to 86400."]}})
    assert run(["rate-limits", "set", "k", "--count", "100001", "--period-seconds",
                "86401"], answer)[0] == 2
    err = capsys.readouterr().err
    assert "--count: Must be an integer from 1 to 100000." in err
    assert "--period-seconds: Must be an integer from 1 to 86400." in err
    answer = (400, {"code": "validation_error", "detail": "Invalid input.",
                    "fields": {"key": ["key must be 1 to 255 printable characters."]}})
    assert run(["rate-limits", "get", "k"], answer)[0] == 2
    assert "KEY: key must be 1 to 255" in capsys.readouterr().err


def test_rate_limits_get_and_delete(env, capsys):
    code, server = run(["rate-limits", "get", "partner api/v2"], (200, LIMIT))
    assert code == 0 and server.seen[0].url.raw_path == LIMIT_PATH
    assert "10 claims per 60 s" in capsys.readouterr().out
    code, server = run(["rate-limits", "delete", "partner api/v2"], (204, None))
    assert code == 0
    assert (server.seen[0].method, server.seen[0].url.raw_path) == ("DELETE", LIMIT_PATH)
    assert "deleted" in capsys.readouterr().out
    code, _ = run(["rate-limits", "delete", "partner api/v2", "--json"], (204, None))
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"key": "partner api/v2", "deleted": True}


def test_a_missing_rate_limit_exits_3_naming_it(env, capsys):
    answer = (404, {"code": "not_found", "detail": "No rate limit for this key."})
    for verb in ("get", "delete"):
        assert run(["rate-limits", verb, "partner"], answer)[0] == 3
        assert "the rate limit of 'partner' not found" in capsys.readouterr().err


def test_rate_limits_list_follows_the_pages_up_to_the_limit(env, capsys):
    page = {"results": [{**LIMIT, "key": k} for k in ("a", "b", "c")], "next": None,
            "previous": None}
    code, server = run(["rate-limits", "list", "--limit", "2"], (200, page))
    assert code == 0 and dict(server.seen[0].url.params) == {"page_size": "3"}
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].split() == ["KEY", "COUNT", "PERIOD_SECONDS", "UPDATED_AT"]
    assert [line.split()[0] for line in lines[1:]] == ["a", "b"]
    assert "--limit N or --all for more" in out.err
    code, server = run(["rate-limits", "list", "--all", "--json"], (200, page))
    assert code == 0 and dict(server.seen[0].url.params) == {"page_size": "500"}
    assert [item["key"] for item in json.loads(capsys.readouterr().out)] == ["a", "b", "c"]
    empty = {"results": [], "next": None, "previous": None}
    assert run(["rate-limits", "list"], (200, empty))[0] == 0
    out = capsys.readouterr()
    assert out.out == "" and "no rate limits" in out.err


# --- fair shares ---------------------------------------------------------------------------

WEIGHT = {"key": "tenant a/7", "weight": 4, "created_at": "2030-01-01T00:00:00Z",
          "updated_at": "2030-01-02T00:00:00Z"}
WEIGHT_PATH = b"/v1/workspaces/ws/fairness-keys/tenant%20a%2F7"


def test_fairness_keys_set_puts_the_weight_and_shows_it(env, capsys):
    code, server = run(["fairness-keys", "set", "tenant a/7", "--weight", "4"], (200, WEIGHT))
    assert code == 0
    [request] = server.seen
    assert (request.method, request.url.raw_path) == ("PUT", WEIGHT_PATH)
    assert server.body() == {"weight": 4}
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split(None, 1) == ["key", "tenant a/7"]
    assert rows[1].split(None, 1) == ["weight", "4"]
    code, _ = run(["fairness-keys", "set", "tenant a/7", "--weight", "4", "--json"],
                  (200, WEIGHT))
    assert code == 0 and json.loads(capsys.readouterr().out) == WEIGHT


@pytest.mark.parametrize("argv", [
    ["fairness-keys", "set", "k"],
    ["fairness-keys", "set", "k", "--weight", "0"],
    ["fairness-keys", "set", "k", "--weight", "x"],
    ["fairness-keys", "set", "--weight", "1"],
    ["fairness-keys", "get"],
    ["fairness-keys", "delete"],
    ["fairness-keys"],
])
def test_fairness_mistakes_are_usage_errors_that_send_nothing(env, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        run(argv)
    assert exc.value.code == 2 and "usage:" in capsys.readouterr().err


def test_a_refused_weight_names_its_options(env, capsys):
    answer = (400, {"code": "validation_error", "detail": "Invalid input.",
                    "fields": {"weight": ["Must be an integer from 1 to 100."]}})
    assert run(["fairness-keys", "set", "k", "--weight", "101"], answer)[0] == 2
    assert "--weight: Must be an integer from 1 to 100." in capsys.readouterr().err
    answer = (400, {"code": "validation_error", "detail": "Invalid input.",
                    "fields": {"key": ["key must be 1 to 255 printable characters."]}})
    assert run(["fairness-keys", "get", "k"], answer)[0] == 2
    assert "KEY: key must be 1 to 255" in capsys.readouterr().err


def test_fairness_keys_get_and_delete(env, capsys):
    code, server = run(["fairness-keys", "get", "tenant a/7"], (200, WEIGHT))
    assert code == 0 and server.seen[0].url.raw_path == WEIGHT_PATH
    assert ["weight", "4"] in [line.split() for line in capsys.readouterr().out.splitlines()]
    code, server = run(["fairness-keys", "delete", "tenant a/7"], (204, None))
    assert code == 0
    assert (server.seen[0].method, server.seen[0].url.raw_path) == ("DELETE", WEIGHT_PATH)
    assert "weighs 1 again" in capsys.readouterr().out
    code, _ = run(["fairness-keys", "delete", "tenant a/7", "--json"], (204, None))
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"key": "tenant a/7", "deleted": True}


def test_a_missing_weight_exits_3_naming_it(env, capsys):
    answer = (404, {"code": "not_found", "detail": "No weight set for this key."})
    for verb in ("get", "delete"):
        assert run(["fairness-keys", verb, "tenant"], answer)[0] == 3
        assert "the weight of 'tenant' not found" in capsys.readouterr().err


def test_fairness_keys_list_follows_the_pages_up_to_the_limit(env, capsys):
    page = {"results": [{**WEIGHT, "key": k} for k in ("a", "b", "c")], "next": None,
            "previous": None}
    code, server = run(["fairness-keys", "list", "--limit", "2"], (200, page))
    assert code == 0 and dict(server.seen[0].url.params) == {"page_size": "3"}
    assert server.seen[0].url.path == "/v1/workspaces/ws/fairness-keys"
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].split() == ["KEY", "WEIGHT", "UPDATED_AT"]
    assert [line.split()[0] for line in lines[1:]] == ["a", "b"]
    assert "--limit N or --all for more" in out.err
    code, server = run(["fairness-keys", "list", "--all", "--json"], (200, page))
    assert code == 0 and dict(server.seen[0].url.params) == {"page_size": "500"}
    assert [item["key"] for item in json.loads(capsys.readouterr().out)] == ["a", "b", "c"]
    empty = {"results": [], "next": None, "previous": None}
    assert run(["fairness-keys", "list"], (200, empty))[0] == 0
    out = capsys.readouterr()
    assert out.out == "" and "no fairness key weights" in out.err


# --- what a demanding user met (a review, 2026-12-05) ----------------------------------------


def test_logs_follow_reads_a_later_attempt_that_ended_within_one_wait(env, capsysbinary):
    # Attempt 1 retried, attempt 2 ran and the job ended, all within one long-poll: attempt
    # 2's log is read to its end before the job's end is told.
    code, _ = run(["jobs", "logs", "j1", "--follow", "--interval", "0.01"],
                  (200, job(status="in_progress", attempt=1)),
                  log(b"one\n", 1, 4),
                  (200, job(status="successful", attempt=2)),
                  log(b"", 1, 4),
                  log(b"two\n", 2, 4))
    assert code == 0 and capsysbinary.readouterr().out == b"one\ntwo\n"


def test_logs_follow_rides_out_a_server_restart(env, capsysbinary, monkeypatch):
    monkeypatch.setattr("jobqueue_client.producer_commands.time.sleep", lambda s: None)
    down = (503, {"code": "unavailable", "detail": "restarting"})
    code, _ = run(["jobs", "logs", "j1", "--follow", "--interval", "0.01"],
                  (200, job(status="in_progress", attempt=1)),
                  log(b"one\n", 1, 4),
                  *[down] * 4,  # the long-poll, sent again and again (3 sends each)
                  (200, job(status="successful", attempt=1)),
                  *[down] * 3,
                  log(b"two\n", 1, 8))
    assert code == 0 and capsysbinary.readouterr().out == b"one\ntwo\n"


def test_a_jobs_text_reaches_the_terminal_without_its_control_characters(env, capsys):
    evil = "done\x1b]52;c;ZXZpbA==\x07\x1b[2J\x9b"
    detail = job(status="failure", attempt=1, message=evil, claim=None,
                 attempts=[{"number": 1, "claimed_at": "t1", "ended_at": "t2",
                            "outcome": "failure", "message": evil}])
    run(["jobs", "get", "j1"], (200, detail))
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "done\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\x9b" in text
    # --json keeps the text exact (JSON escapes it).
    run(["jobs", "get", "j1", "--json"], (200, detail))
    assert json.loads(capsys.readouterr().out)["message"] == evil


@pytest.mark.parametrize(("stdin", "config", "says"), [
    (None, '{"x": NaN}', "NaN is not a JSON number"),
    (None, '{"x": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"x": "\xff"}', "-", "stdin is not UTF-8 text"),
    (b'\xef\xbb\xbf{"x": 1}', "-", None),  # a byte order mark is fine
])
def test_a_config_that_is_not_json_or_not_utf8_is_a_usage_error(env, capsys, monkeypatch,
                                                                stdin, config, says):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code, server = run(["jobs", "create", "--agent", "ag", "--config", config], (201, JOB))
    if says is None:
        assert code == 0 and server.body()["job_agent_config"] == {"x": 1}
    else:
        assert code == 2 and server.seen == [] and says in capsys.readouterr().err


def test_an_argument_with_bytes_that_are_not_utf8_is_a_usage_error(env, capsys):
    # A shell passes such bytes as lone surrogates (the file system's encoding).
    code, server = run(["jobs", "create", "--agent", "ag", "--config", '{"x": "\udcff"}'])
    assert code == 2 and server.seen == []
    assert "--config: the value is not UTF-8 text" in capsys.readouterr().err


def test_logs_follow_waits_out_a_throttle_and_stops_at_a_refusal(env, capsysbinary,
                                                                 monkeypatch):
    slept = []
    monkeypatch.setattr("jobqueue_client.producer_commands.time.sleep", slept.append)
    code, _ = run(["jobs", "logs", "j1", "--follow", "--interval", "0.01"],
                  (200, job(status="in_progress", attempt=1)),
                  log(b"one\n", 1, 4),
                  (429, {"code": "throttled", "detail": "slow down"}, {"Retry-After": "7"}),
                  (404, {"code": "not_found", "detail": "No such job."}))
    assert code == 3 and capsysbinary.readouterr().out == b"one\n"  # 3: not found
    assert 7.0 in slept  # the server's Retry-After, not the backoff


def test_a_download_onto_a_directory_of_that_name_is_a_usage_error(env, capsys, tmp_path):
    (tmp_path / "out" / "a.txt").mkdir(parents=True)
    listed = {"results": [{"name": "a.txt", "size": 1, "sha256": "x", "attempt": 1}]}
    code, _ = run(["jobs", "artifacts", "j1", "--download", tmp_path / "out"],
                  (200, listed), (200, b"x", {"Content-Length": "1"}))
    assert code == 2
    assert "--download: cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["jobs", "wait", "j1", "--timeout", "inf"],
                                  ["jobs", "logs", "j1", "--follow", "--interval", "nan"]])
def test_a_wait_or_an_interval_that_is_not_finite_is_a_usage_error(env, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        producer_cli.main(argv)
    assert exc.value.code == 2 and "not a finite number" in capsys.readouterr().err
