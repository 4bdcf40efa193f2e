"""Real processes for the acceptance suite: an API server (gunicorn), `jobqueue-agent`
processes, reapers (`manage.py reap_claims`), all on the test database pytest-django created.

Every process is started in its own session and ended by its own id (never by name). Job
commands are small `sh` scripts that append one line per start and per end to an execution log,
so that tests can count executions and find (and end) children orphaned by a killed agent.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.db import connection

from tests import utils

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = str(Path(sys.executable).with_name("gunicorn"))
logging.getLogger("httpx").setLevel(logging.WARNING)


def database_url() -> str:
    """The URL of the database this test runs on (pytest-django's test database)."""
    d = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = d.get("USER") or "postgres"
        if d.get("PASSWORD"):
            auth += ":" + d["PASSWORD"]
        host, port = d.get("HOST") or "127.0.0.1", d.get("PORT") or 5432
        return f"postgres://{auth}@{host}:{port}/{d['NAME']}"
    name = str(d["NAME"])
    if not os.path.isabs(name):
        raise RuntimeError("e2e tests need a file-backed SQLite test database (SQLITE_TEST_NAME)")
    return f"sqlite:///{name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# tests/utils.py's bounded wait, polling real processes every 0.1 s unless told otherwise.
wait_for = functools.partial(utils.wait_for, interval=0.1)


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set size so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def tail_of(*paths: Path, size: int = 3000) -> str:
    """The last `size` characters of each file that exists (a process's logs, for a failure)."""
    text = ""
    for path in paths:
        try:
            text += path.read_text(errors="replace")[-size:]
        except OSError:
            pass
    return text


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return state != "Z"


@dataclass(eq=False)  # compared and hashed by identity
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    # A line the process prints once its signal handlers are installed (agents and reapers):
    # a SIGTERM before it would meet the default action and kill the process.
    ready_line: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=30)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def ready(self) -> bool:
        return self.ready_line is None or self.ready_line in self.output()

    def wait_ready(self, timeout: float = 60) -> Proc:
        """Wait for the ready line (or for the process to exit: nothing to wait for then)."""
        wait_for(lambda: self.ready() or not self.alive(), timeout,
                 f"{self.name} to be ready ({self.ready_line!r})",
                 interval=0.05, on_fail=lambda: self.output()[-3000:])
        return self

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (after SIGCONT, in case it is stopped) and wait for the exit status. A
        process that has not installed its handlers yet is waited for first."""
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)
            self.wait_ready()
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        return self.popen.wait(timeout=timeout)


class Stack:
    """One test's processes. `close()` ends every one of them, and their orphans. As a
    context manager: started with its API server, closed at the end."""

    def __init__(self, tmp_path: Path, *, server_env: dict | None = None,
                 db_url: str | None = None):
        self.tmp = tmp_path
        self.db_url = db_url or database_url()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.marker = f"e2e-{uuid.uuid4().hex[:12]}"
        self.exec_log = tmp_path / "executions.log"
        self.exec_log.touch()
        self.procs: list[Proc] = []
        self.server: Proc | None = None
        self.server_env = server_env or {}
        self._n = Counter()

    def __enter__(self) -> Stack:
        try:
            self.start_server()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- environment --

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("JOBQUEUE_", "DATABASE_URL", "SQLITE_TEST_NAME"))}
        env.update({
            "DATABASE_URL": self.db_url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DJANGO_DEBUG": "0",
            "JOBQUEUE_MIN_LEASE_SECONDS": "1",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT),
            "E2E_LOG": str(self.exec_log),
        })
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def _spawn(self, name: str, argv: list[str], env: dict, preexec_fn=None,
               ready_line: str | None = None) -> Proc:
        self._n[name] += 1
        log = self.tmp / f"{name}-{self._n[name]}.log"
        fh = open(log, "ab")  # noqa: SIM115 - handed to the child
        popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=fh,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=preexec_fn)
        fh.close()
        proc = Proc(name, popen, log, ready_line)
        self.procs.append(proc)
        return proc

    # -- the API server --

    def start_server(self, workers: int = 2, threads: int = 8, *,
                     access_log: Path | None = None) -> Proc:
        """The API server on the stack's port, replacing the one running there (stopped
        first: a second gunicorn could not bind the port, and the first one would answer)."""
        if self.server is not None and self.server.alive():
            self.server.stop()
        self.server = self.start_replica(self.port, workers, threads, name="server",
                                         access_log=access_log)
        return self.server

    def start_replica(self, port: int, workers: int = 2, threads: int = 8, *,
                      name: str = "replica", access_log: Path | None = None) -> Proc:
        """Another API server (gunicorn) on `port`, with the same environment; with
        `access_log`, gunicorn writes every request's status there."""
        argv = [GUNICORN, "-c", str(ROOT / "config" / "gunicorn.conf.py"),
                "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
                "--threads", str(threads),
                "--timeout", "60", "--graceful-timeout", "2", "--log-level", "warning"]
        if access_log is not None:
            argv += ["--access-logfile", str(access_log)]
        proc = self._spawn(name, argv, self.env(**self.server_env))
        wait_for(lambda: self._server_answers(proc, f"http://127.0.0.1:{port}"), 60,
                 "the API server to answer", on_fail=lambda: proc.output()[-3000:])
        return proc

    def _server_answers(self, proc: Proc, url: str) -> bool:
        if not proc.alive():
            raise AssertionError("server exited:\n" + proc.output()[-3000:])
        try:
            r = httpx.get(f"{url}/v1/workspaces/x/jobs", timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code in (401, 403, 404)

    def kill_server(self) -> None:
        """SIGKILL the server and its workers at once (a crash, not a shutdown)."""
        assert self.server is not None
        self.server.kill_group()

    # -- agents and reapers --

    def start_agent(self, job_agent, token: str, name: str, *, concurrency: int = 1,
                    drain_timeout: float = 10, kill_grace: float = 1, idle_max: float = 0.5,
                    extra_env: dict | None = None, tmpdir: Path | None = None,
                    address_space_bytes: int | None = None, wait_ready: bool = True,
                    server_url: str | None = None) -> Proc:
        """A `jobqueue-agent` process. Its TMPDIR (where its job directories go) is its own,
        tmp-<name>, unless `tmpdir` is given; `address_space_bytes` caps its memory
        (RLIMIT_AS: beyond it, allocations fail with MemoryError). With wait_ready (the
        default), it returns once the agent runs its claim loop with its signal handlers
        installed (its `event=started` line)."""
        tmpdir = tmpdir or self.tmp / f"tmp-{name}"
        tmpdir.mkdir(exist_ok=True)
        env = self.env(
            JOBQUEUE_SERVER=server_url or self.url,
            JOBQUEUE_WORKSPACE=job_agent.workspace_id,
            JOBQUEUE_AGENT=job_agent.id,
            JOBQUEUE_TOKEN=token,
            TMPDIR=tmpdir,
            E2E_AGENT=name,
            **(extra_env or {}),
        )
        argv = [sys.executable, "-m", "jobqueue_client.cli", "--concurrency", str(concurrency),
                "--drain-timeout", str(drain_timeout), "--kill-grace", str(kill_grace),
                "--idle-max", str(idle_max)]
        preexec_fn = None
        if address_space_bytes is not None:
            def preexec_fn():
                resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
        proc = self._spawn(f"agent-{name}", argv, env, preexec_fn=preexec_fn,
                           ready_line="event=started ")
        return proc.wait_ready() if wait_ready else proc

    def start_reaper(self, interval: float = 0.3, batch_size: int | None = None,
                     wait_ready: bool = True) -> Proc:
        argv = [sys.executable, "manage.py", "reap_claims", "--loop", "--interval", str(interval)]
        if batch_size:
            argv += ["--batch-size", str(batch_size)]
        proc = self._spawn("reaper", argv, self.env(), ready_line="reaper looping every")
        return proc.wait_ready() if wait_ready else proc

    def start_maintenance(self, wait_ready: bool = True, **env) -> Proc:
        """`run_maintenance --loop`, every service on its own interval (JOBQUEUE_* in env)."""
        argv = [sys.executable, "manage.py", "run_maintenance", "--loop"]
        proc = self._spawn("maintenance", argv, self.env(**env),
                           ready_line="maintenance looping")
        return proc.wait_ready() if wait_ready else proc

    def reap_once(self) -> str:
        out = subprocess.run([sys.executable, "manage.py", "reap_claims", "--json"], cwd=ROOT,
                             env=self.env(), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    # -- jobs' command and their executions --

    def command(self, body: str = "", *, first_attempt: str | None = None) -> list[str]:
        """sh script: logs its start, runs `body` (or `first_attempt` on attempt 1), writes
        {"attempt", "agent", "context_bytes"} to JOB_RESULT_FILE, logs its end."""
        if first_attempt is not None:
            body = f'if [ "$JOB_ATTEMPT" = 1 ]; then {first_attempt}; else {body or ":"}; fi'
        script = (
            f"# {self.marker}\n"
            'echo "$JOB_ID $JOB_ATTEMPT start $$ $E2E_AGENT" >> "$E2E_LOG"\n'
            f"{body or ':'}\n"
            'printf \'{"attempt": %s, "agent": "%s", "context_bytes": %s}\' "$JOB_ATTEMPT" '
            '"$E2E_AGENT" "$(wc -c < "$JOB_CONTEXT_FILE")" > "$JOB_RESULT_FILE"\n'
            'echo "$JOB_ID $JOB_ATTEMPT end $$ $E2E_AGENT" >> "$E2E_LOG"\n'
        )
        return ["sh", "-c", script]

    def executions(self) -> list[dict]:
        rows = []
        for line in self.exec_log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5:
                rows.append({"job": parts[0], "attempt": int(parts[1]), "what": parts[2],
                             "pid": int(parts[3]), "agent": parts[4]})
        return rows

    def starts(self, job_id=None) -> list[dict]:
        return [r for r in self.executions()
                if r["what"] == "start" and (job_id is None or r["job"] == str(job_id))]

    def logs(self) -> str:
        return "\n".join(f"==== {p.log.name}\n{p.output()[-4000:]}" for p in self.procs)

    # -- teardown --

    def close(self, grace: float = 5) -> None:
        """End every process: SIGTERM first, so that they exit through their own shutdown
        (and coverage saves their data), SIGKILL for whatever is left after `grace` seconds.
        Agents go first (a second SIGTERM ends their drain at once; what they release needs
        the server), then the reapers and the server together."""
        alive = [p for p in self.procs if p.alive()]
        agents = [p for p in alive if p.name.startswith("agent-")]
        for proc in agents:
            proc.signal(signal.SIGCONT)
            if proc.ready():
                proc.signal(signal.SIGTERM)
                proc.signal(signal.SIGTERM)
            else:  # its handlers are not installed yet: a SIGTERM would only kill it too
                proc.kill_group()
        self._wait_or_kill(agents, grace)
        rest = [p for p in alive if p not in agents]
        for proc in rest:
            proc.signal(signal.SIGCONT)
            if proc.name in ("server", "replica"):  # gunicorn quick shutdown: workers sys.exit
                proc.signal(signal.SIGQUIT)
            elif proc.ready():
                proc.signal(signal.SIGTERM)
            else:
                proc.kill_group()
        self._wait_or_kill(rest, grace)
        for proc in self.procs:  # nothing should be left; if it is, it goes now
            if proc.alive():
                proc.kill_group()
        # Children of killed agents live on in their own sessions: end them by pid, after
        # checking that the pid still runs one of this test's commands.
        for row in self.executions():
            pid = row["pid"]
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if self.marker.encode() in cmdline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    @staticmethod
    def _wait_or_kill(procs: list[Proc], grace: float) -> None:
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill_group()


# --- checks against the event log ----------------------------------------------------------


def audit(job_ids=None) -> dict:
    """Replay each job's timeline (its events in time order, an agent's final report read
    from the job row: jobqueue/timeline.py) and check fencing: every accepted agent write
    (status_reported, progress_reported, released) and every reap carries the claim that was
    current at that point. Returns counts and the list of violations."""
    from jobqueue import states, timeline
    from jobqueue.models import Job, JobEvent

    scope = Job.objects.all() if job_ids is None else Job.objects.filter(id__in=list(job_ids))
    events = (ev for job in scope for ev in timeline.events(job, 1_000_000))
    current: dict = {}
    terminal = Counter()
    violations = []
    kinds = Counter()
    for ev in events:
        kinds[ev.kind] += 1
        job = ev.job_id
        if ev.kind == JobEvent.CLAIMED:
            if current.get(job):
                violations.append(f"{job}: claimed while claim {current[job]} was live")
            current[job] = ev.claim_id
        elif ev.kind in (JobEvent.STATUS_REPORTED, JobEvent.PROGRESS_REPORTED,
                         JobEvent.RELEASED, JobEvent.REAPED, JobEvent.EXPIRED,
                         JobEvent.TIMED_OUT):
            if ev.claim_id != current.get(job):
                violations.append(
                    f"{job}: {ev.kind} with claim {ev.claim_id}, current {current.get(job)}")
            if ev.kind != JobEvent.PROGRESS_REPORTED:
                current[job] = None
            # Terminal unless it queued the job again (a timeout or a retryable failure with
            # attempts left: detail requeued).
            detail = ev.detail or {}
            if ev.kind == JobEvent.EXPIRED or (
                ev.kind in (JobEvent.STATUS_REPORTED, JobEvent.TIMED_OUT)
                and (ev.kind == JobEvent.TIMED_OUT or detail.get("status") in states.TERMINAL)
                and not detail.get("requeued")
            ):
                terminal[job] += 1
        elif ev.kind == JobEvent.DEADLINE_PASSED:  # expired before it ran: no claim
            terminal[job] += 1
        elif ev.kind in (JobEvent.CANCELLED, JobEvent.REQUEUED):
            current[job] = None
    jobs = Job.objects.all() if job_ids is None else Job.objects.filter(id__in=list(job_ids))
    statuses = Counter(jobs.values_list("status", flat=True))
    not_once = {str(j.id): terminal[j.id] for j in jobs.only("id") if terminal[j.id] != 1}
    return {"violations": violations, "terminal_not_once": not_once, "kinds": kinds,
            "statuses": statuses}


def duplicated_executions(stack: Stack, job_ids) -> int:
    per_job = defaultdict(int)
    for row in stack.starts():
        per_job[row["job"]] += 1
    return sum(max(0, per_job[str(j)] - 1) for j in job_ids)


def dumps(obj) -> str:
    return json.dumps(obj, default=str, sort_keys=True)
