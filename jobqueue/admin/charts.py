"""The charts on the Recovery page, drawn on the server as inline SVG (no script, no CDN):
jobs finished per minute by status (the average of each 15 minutes) and the queue's depth,
both over the last 24 hours, by the database's clock, with bounded queries: each reads one
time window and answers grouped rows (at most a bucket per quarter hour or hour per kind or
status), never one row per job or event. The finished jobs come from the jobs themselves
(their status and `completed_at`, `job_finished_idx`): an agent's final report is read from
the job row, not stored as an event (jobqueue/timeline.py). The depth comes from the job
events (the `job_event_created_brin` index on PostgreSQL) and, for the latest claims, whose
`claimed` the job row says (jobqueue/timeline.py), from the jobs (their `started_at`); an
agent's report moves no job in or out of the queue, so the events it no longer stores change
nothing there.

The queue's depth is read back from now: the queued jobs counted now, minus each later hour's
net inflow (created queued, dispatched, released, reaped, requeued: in; claimed, cancelled or
marked failed while queued: out). An operator's cancel or mark-failed of a job that held no
claim is counted as leaving the queue (it may have been pending); a requeue as entering it.
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Count, Q
from django.db.models.fields.json import KT
from django.db.models.functions import ExtractMinute, Floor, TruncHour
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from jobqueue import states
from jobqueue.models import Job, JobEvent

FINISHED_HOURS = 24
FINISHED_BUCKET_MINUTES = 15  # a divisor of 60
DEPTH_HOURS = 24
# Fixed colours per terminal status (the labels are ours, never a client's value).
FINISHED_SERIES = [
    (states.SUCCESSFUL, "#2b7a0b"),
    (states.FAILURE, "#ba2121"),
    (states.CANCELLED, "#777777"),
    (states.EXPIRED, "#e08e0b"),
]
_QUEUE_KINDS = [
    JobEvent.CREATED, JobEvent.DISPATCHED, JobEvent.CLAIMED, JobEvent.RELEASED,
    JobEvent.REAPED, JobEvent.REQUEUED, JobEvent.CANCELLED, JobEvent.STATUS_REPORTED,
]


def _truthy(value) -> bool:
    # JSON booleans read back as 'true' (PostgreSQL) or 1 (SQLite).
    return str(value).lower() in ("true", "1")


def finished_per_minute(now: dt.datetime, hours: int = FINISHED_HOURS,
                        bucket: int = FINISHED_BUCKET_MINUTES) -> dict:
    """{"starts": [bucket start, ...], "bucket_minutes": bucket, "series": {status: [jobs
    finished in each bucket]}} for the `bucket`-minute buckets of the last `hours` hours up
    to `now` (the database's time), oldest first; the last bucket is the one `now` is in."""
    n = hours * 60 // bucket
    end = now.replace(minute=now.minute - now.minute % bucket, second=0, microsecond=0)
    starts = [end - dt.timedelta(minutes=bucket * (n - 1 - i)) for i in range(n)]
    index = {start: i for i, start in enumerate(starts)}
    series = {status: [0] * n for status, _ in FINISHED_SERIES}
    rows = (
        Job.objects.filter(status__in=list(series), completed_at__gte=starts[0])
        .annotate(hour=TruncHour("completed_at"),
                  part=Floor(ExtractMinute("completed_at") / bucket))
        .values("hour", "part", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        i = index.get(row["hour"] + dt.timedelta(minutes=bucket * int(row["part"])))
        if i is not None:
            series[row["status"]][i] += row["n"]
    return {"starts": starts, "bucket_minutes": bucket, "series": series}


def _queue_delta(kind: str, created_status, superseded) -> int:
    if kind == JobEvent.CREATED:
        return 1 if created_status == states.QUEUED else 0
    if kind in (JobEvent.DISPATCHED, JobEvent.RELEASED, JobEvent.REAPED, JobEvent.REQUEUED):
        return 1
    if kind == JobEvent.CLAIMED:
        return -1
    # cancelled, or an operator's mark-failed (status_reported with superseded_claim):
    # without a claim the job left the queue; with one it was in progress.
    if superseded is None:  # an agent's report: the job was in progress
        return 0
    return 0 if _truthy(superseded) else -1


def _claims_said(since: dt.datetime):
    """[(hour, claims)]: the jobs' latest claims made since `since` that no event row
    stores (their `claimed` is read from the job row, jobqueue/timeline.py), by hour. Such a
    job is queued or in progress now, or finished since (job_finished_idx): a claim made in
    the window finished no earlier."""
    rows = (
        Job.objects.filter(Q(status__in=[states.QUEUED, states.IN_PROGRESS])
                           | Q(status__in=sorted(states.TERMINAL), completed_at__gte=since),
                           started_at__gte=since, last_claim_id__isnull=False,
                           claim_lease_seconds__isnull=False)
        .annotate(hour=TruncHour("started_at"))
        .values("hour")
        .annotate(n=Count("id"))
        .order_by()
    )
    return [(row["hour"], row["n"]) for row in rows]


def queue_depth(now: dt.datetime, hours: int = DEPTH_HOURS) -> dict:
    """{"ends": [time, ...], "depth": [queued jobs at each time]}: the end of each of the
    last `hours` hours, the last one `now`, oldest first."""
    current = now.replace(minute=0, second=0, microsecond=0)
    starts = [current - dt.timedelta(hours=hours - 1 - i) for i in range(hours)]
    index = {start: i for i, start in enumerate(starts)}
    net = [0] * hours
    rows = (
        JobEvent.objects.filter(created_at__gte=starts[0], kind__in=_QUEUE_KINDS)
        .annotate(
            hour=TruncHour("created_at"),
            created_status=KT("detail__status"),
            superseded=KT("detail__superseded_claim"),
        )
        .values("hour", "kind", "created_status", "superseded")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        i = index.get(row["hour"])
        if i is not None:
            net[i] += row["n"] * _queue_delta(row["kind"], row["created_status"],
                                              row["superseded"])
    for hour, n in _claims_said(starts[0]):
        i = index.get(hour)
        if i is not None:
            net[i] -= n
    depth = [0] * hours
    level = Job.objects.filter(status=states.QUEUED).count()
    for i in range(hours - 1, -1, -1):
        depth[i] = max(0, level)
        level -= net[i]
    ends = [start + dt.timedelta(hours=1) for start in starts[:-1]] + [now]
    return {"ends": ends, "depth": depth}


# --- drawing --------------------------------------------------------------------------------

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 200, 44, 22, 10


def _frame(title: str, top, start_label: str, end_label: str) -> list[str]:
    plot_h = HEIGHT - BOTTOM - TOP
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" class="jq-chart">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH}" y2="{TOP + plot_h}" '
        'stroke="#999"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end" font-size="11">{top}</text>',
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" font-size="11">0</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 6}" font-size="11">{escape(start_label)}</text>',
        f'<text x="{WIDTH}" y="{HEIGHT - 6}" text-anchor="end" font-size="11">'
        f"{escape(end_label)}</text>",
    ]


def finished_chart_svg(data: dict) -> SafeString:
    """Stacked bars, one per bucket, one colour per status; heights are jobs per minute
    (the bucket's count over its minutes)."""
    n, bucket = len(data["starts"]), data["bucket_minutes"]
    totals = [sum(data["series"][s][i] for s, _ in FINISHED_SERIES) for i in range(n)]
    top = max(totals + [1])
    plot_h = HEIGHT - BOTTOM - TOP
    step = (WIDTH - LEFT) / n
    parts = _frame(
        f"Jobs finished per minute by status ({bucket}-minute averages), last 24 hours",
        f"{top / bucket:.1f}", f"{data['starts'][0]:%m-%d %H:%M}",
        f"{data['starts'][-1]:%m-%d %H:%M} UTC",
    )
    for i in range(n):
        y = TOP + plot_h
        for status, colour in FINISHED_SERIES:
            count = data["series"][status][i]
            if not count:
                continue
            h = plot_h * count / top
            y -= h
            parts.append(
                f'<rect x="{LEFT + i * step + 1:.1f}" y="{y:.1f}" width="{max(step - 2, 1):.1f}" '
                f'height="{h:.1f}" fill="{colour}" data-status="{status}" data-count="{count}">'
                f"<title>{data['starts'][i]:%H:%M} {status}: {count} in {bucket} min "
                f"({count / bucket:.1f}/min)</title></rect>"
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - numbers and our own labels, escaped


def depth_chart_svg(data: dict) -> SafeString:
    """A line through the queue's depth at the end of each hour."""
    depth = data["depth"]
    top = max(depth + [1])
    plot_h = HEIGHT - BOTTOM - TOP
    step = (WIDTH - LEFT) / max(len(depth) - 1, 1)
    points = " ".join(
        f"{LEFT + i * step:.1f},{TOP + plot_h - plot_h * d / top:.1f}" for i, d in enumerate(depth)
    )
    parts = _frame(
        "Queued jobs over the last 24 hours", top,
        f"{data['ends'][0]:%m-%d %H:%M}", f"{data['ends'][-1]:%m-%d %H:%M} UTC",
    )
    parts.append(f'<polyline fill="none" stroke="#417690" stroke-width="2" points="{points}"/>')
    for i, d in enumerate(depth):
        parts.append(
            f'<circle cx="{LEFT + i * step:.1f}" cy="{TOP + plot_h - plot_h * d / top:.1f}" '
            f'r="2.5" fill="#417690" data-depth="{d}"><title>{data["ends"][i]:%H:%M}: {d} queued'
            "</title></circle>"
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - numbers and our own labels, escaped


def charts_context(now: dt.datetime) -> dict:
    finished = finished_per_minute(now)
    depth = queue_depth(now)
    return {
        "finished_chart": finished_chart_svg(finished),
        "finished_legend": FINISHED_SERIES,
        "finished_totals": {s: sum(v) for s, v in finished["series"].items()},
        "depth_chart": depth_chart_svg(depth),
        "depth_now": depth["depth"][-1],
    }
