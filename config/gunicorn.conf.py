"""The production server: `gunicorn -c config/gunicorn.conf.py` (`make run` uses it).

The serving model is gthread: each worker process runs a pool of threads, one request per
thread, with idle keep-alive connections parked in the worker's event loop (they hold no
thread). A long-poll claim (`wait_seconds`) holds its thread, so a process holds at most
JOBQUEUE_MAX_WAITING_CLAIMS waits (past the cap a claim answers at once, as if
`wait_seconds` were 0) and has GUNICORN_SPARE_THREADS more threads than that for everything
else: heartbeats, reports and producers never queue behind held waits. A held wait closes
its database connection while it sleeps (docs/api.md, "Waiting"; the first
JOBQUEUE_WARM_WAITS of a process keep theirs), so threads that wait cost the database
nothing. gthread's main thread keeps the worker's heartbeat with the arbiter, so a wait
never trips `timeout`. On SIGTERM the worker ends its held waits at once (each answers as
its deadline would), then drains within `graceful_timeout`.

`--bind` and `--workers` (and any other setting) may still be given on the command line.
"""

import os


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


wsgi_app = "config.wsgi:application"
worker_class = "gthread"
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = _int("GUNICORN_WORKERS", _int("WEB_CONCURRENCY", 2))
# The same default as config/settings.py's JOBQUEUE["MAX_WAITING_CLAIMS"].
max_waiting = _int("JOBQUEUE_MAX_WAITING_CLAIMS", 200)
threads = _int("GUNICORN_THREADS", max_waiting + _int("GUNICORN_SPARE_THREADS", 32))
# Clients the worker's event loop keeps (waiting, or idle on keep-alive).
worker_connections = max(1000, threads * 2)
keepalive = _int("GUNICORN_KEEPALIVE", 75)
timeout = _int("GUNICORN_TIMEOUT", 60)
graceful_timeout = _int("GUNICORN_GRACEFUL_TIMEOUT", 10)
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None


def post_worker_init(worker):
    """Leave threads for everything else whatever `--threads` says (at least a quarter of
    them, at most GUNICORN_SPARE_THREADS), and on SIGTERM end this worker's held waits
    before gunicorn's graceful drain."""
    import signal

    from jobqueue import wakeups

    n = worker.cfg.threads
    wakeups.hub().thread_cap = n - max(1, min(_int("GUNICORN_SPARE_THREADS", 32), n // 4))

    def on_term(signum, frame):
        wakeups.shutdown()
        worker.handle_exit(signum, frame)

    signal.signal(signal.SIGTERM, on_term)
