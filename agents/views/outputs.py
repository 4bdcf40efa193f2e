"""Job outputs: the attempt's log (agent appends, producer reads) and its artifacts (agent
uploads, producer lists and downloads). The bodies are not JSON: a log chunk or a file is
raw bytes, read from the request as they came; an upload streams, never held in memory."""

from __future__ import annotations

import re

from django.http import FileResponse, HttpResponse
from django.utils.http import content_disposition_header, parse_etags
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from jobqueue.lifecycle import artifacts, logs

from ..bodies import ClientBody
from ..exceptions import PayloadTooLarge
from ..query import DIGITS, query_int
from ..schema import COMMON, ErrorSerializer, errors
from ..serializers.outputs import ArtifactListSerializer, ArtifactSerializer, LogAppendSerializer
from .base import AGENT, AGENT_TAGS, PRODUCER, PRODUCER_TAGS, ApiViewSet, parse_uuid

# GitLab's runner sends "0-99"; RFC 9110 writes "bytes 0-99/*" (or a total for the last).
CONTENT_RANGE = re.compile(r"(?:bytes[ =])?(\d{1,15})-(\d{1,15})(?:/(?:\d{1,15}|\*))?")
MAX_READ_BYTES = 16 * 1024 * 1024
MAX_QUERY_INT = 10**15 - 1  # ?offset=, ?attempt=

RAW_BODY_400 = OpenApiResponse(
    ErrorSerializer, description="validation_error: missing or invalid input (see `fields`); "
    "incomplete_body: the body ended before its Content-Length or its last chunk")

CLAIM_HEADER = OpenApiParameter(
    "X-Claim-Id", OpenApiTypes.UUID, OpenApiParameter.HEADER, required=True,
    description="The claim_id of the claim that writes.",
)


def claim_header(request):
    claim_id = parse_uuid(request.headers.get("X-Claim-Id"))
    if claim_id is None:
        raise ValidationError({"X-Claim-Id": ["This header is required and must be a UUID."]})
    return claim_id


def content_range(request, size: int) -> int | None:
    """The chunk's start from Content-Range (None without one: append at the end)."""
    raw = request.headers.get("Content-Range")
    if raw is None:
        return None
    match = CONTENT_RANGE.fullmatch(raw.strip())
    if match is None:
        raise ValidationError({"Content-Range": ["Must be `bytes <start>-<end>/*`."]})
    start, end = int(match[1]), int(match[2])
    if end - start + 1 != size:
        raise ValidationError({"Content-Range": [
            "Must name the body's bytes: <end> - <start> + 1 is the body's length."]})
    return start


def non_negative_int(request, name):
    return query_int(request, name, 0, MAX_QUERY_INT)


class JobOutputViewSet(ApiViewSet):
    # workspaces/{workspace_id}/jobs/{job_id}/log
    def initial(self, request, *args, **kwargs):
        # Not ApiViewSet's: a log chunk is raw bytes of any media type, never parsed.
        super(ApiViewSet, self).initial(request, *args, **kwargs)

    @extend_schema(
        methods=["GET"],
        tags=[*AGENT_TAGS, *PRODUCER_TAGS],
        operation_id="read_log",
        summary="An attempt's log from a byte offset (text/plain), live while it runs",
        parameters=[
            OpenApiParameter("attempt", OpenApiTypes.INT, required=False,
                             description="Default: the latest attempt with a log."),
            OpenApiParameter("offset", OpenApiTypes.INT, required=False,
                             description="The first byte to return (default 0)."),
        ],
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="The log's bytes from `offset`; headers "
                "X-Log-Attempt and X-Log-Length say whose log and how long it is now."),
            **errors(400, *COMMON),
        },
    )
    @extend_schema(
        methods=["PATCH"],
        tags=AGENT_TAGS,
        operation_id="append_log",
        summary="Append to the claim's attempt's log (GitLab's trace protocol)",
        parameters=[
            CLAIM_HEADER,
            OpenApiParameter(
                "Content-Range", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                description="`bytes <start>-<end>/*` (end inclusive). Bytes before the log's "
                "end are accepted unchanged; a start past it is 416. Without it: append.",
            ),
        ],
        request={"text/plain": OpenApiTypes.BINARY,
                 "application/octet-stream": OpenApiTypes.BINARY},
        responses={
            202: OpenApiResponse(LogAppendSerializer,
                                 description="Appended (or a repeat, accepted unchanged); "
                                 "the Range header is `0-<length>`."),
            416: OpenApiResponse(ErrorSerializer,
                                 description="log_range_gap: resend from the Range header's "
                                 "length"),
            **errors(409, 411, 413, *COMMON), 400: RAW_BODY_400,
        },
    )
    @action(detail=False, methods=["get", "patch"], url_path="log", url_name="log",
            permission_classes=AGENT, name="Log")
    def log(self, request, workspace_id, job_id):
        job_id = self.path_uuid("job_id")
        if request.method in READS:
            return self._read_log(job_id)
        claim_id = claim_header(request)
        data = whole_body(request._request)
        state = logs.append_log(job_id, claim_id, data, start=content_range(request, len(data)),
                                **self.job_scope())
        return Response(LogAppendSerializer(state).data, status=status.HTTP_202_ACCEPTED,
                        headers={"Range": f"0-{state.length}"})

    def _read_log(self, job_id):
        attempt = non_negative_int(self.request, "attempt")
        offset = non_negative_int(self.request, "offset") or 0
        head = self.request.method == "HEAD"  # the same headers, no bytes read or sent
        piece = logs.read_log(job_id, attempt=attempt, offset=offset,
                              limit=0 if head else MAX_READ_BYTES, **self.job_scope())
        response = HttpResponse(piece.data, content_type="text/plain; charset=utf-8")
        response["Content-Length"] = str(
            max(0, min(piece.length, offset + MAX_READ_BYTES) - offset) if head
            else len(piece.data))
        response["X-Log-Attempt"] = str(piece.attempt)
        response["X-Log-Length"] = str(piece.length)
        response["X-Content-Type-Options"] = "nosniff"
        return response

    # --- artifacts

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_artifacts",
        summary="The job's published artifact set",
        responses={200: ArtifactListSerializer, **errors(*COMMON)},
    )
    @action(detail=False, methods=["get"], url_path="artifacts", url_name="artifacts",
            permission_classes=PRODUCER, name="Artifacts")
    def artifacts(self, request, workspace_id, job_id):
        rows = artifacts.published_artifacts(self.path_uuid("job_id"),
                                             workspace_id=self.principal.workspace_id)
        return Response({"results": ArtifactSerializer(rows, many=True).data})

    @extend_schema(
        methods=["GET"],
        tags=PRODUCER_TAGS,
        operation_id="download_artifact",
        summary="Download a published artifact (attachment, ETag = its sha256)",
        parameters=[
            OpenApiParameter(
                "Range", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                description="`bytes=<start>-<end>` (or `<start>-`, `-<n>`): one range. An "
                "invalid one (`bytes=5-3`) or several are ignored: the whole file."),
            OpenApiParameter(
                "If-Range", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                description="The ETag the range belongs to; anything else: the whole file."),
            OpenApiParameter(
                "If-None-Match", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                description="ETags (weak comparison) or `*`: 304 when one is current."),
        ],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description="The file, streamed, with Content-Length, "
                "ETag (its sha256), Content-Disposition: attachment and nosniff."),
            (206, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description="One range (`Range: bytes=a-b`), with "
                "Content-Range."),
            304: OpenApiResponse(description="If-None-Match named its ETag (weak "
                                 "comparison) or was `*`."),
            416: OpenApiResponse(description="The range starts past the end (Content-Range "
                                 "`bytes */<size>`)."),
            **errors(*COMMON),
        },
    )
    @extend_schema(
        methods=["PUT"],
        tags=AGENT_TAGS,
        operation_id="upload_artifact",
        summary="Upload a file, staged for the claim's attempt (published by its successful "
        "report)",
        parameters=[CLAIM_HEADER],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={201: ArtifactSerializer, 400: RAW_BODY_400,
                   **errors(409, 411, 413, *COMMON)},
    )
    @action(detail=False, methods=["get", "put"], url_path="artifacts/<anyid:name>",
            url_name="artifact", permission_classes=AGENT, name="Artifact")
    def artifact(self, request, workspace_id, job_id, name):
        job_id = self.path_uuid("job_id")
        if request.method in READS:
            return self._download(job_id, name)
        claim_id = claim_header(request)
        stream, size = upload_stream(request._request)
        info = artifacts.upload_artifact(
            job_id, claim_id, name, stream, content_type=request.content_type,
            declared_size=size, **self.job_scope())
        return Response(ArtifactSerializer(info).data, status=status.HTTP_201_CREATED)

    def _download(self, job_id, name):
        """RFC 9110's order: If-None-Match (weak comparison; 304), then Range (one range,
        under If-Range's strong comparison). HEAD: the same headers, the file not opened."""
        request = self.request
        if self.principal.is_agent:
            artifacts.fetch_job(job_id, job_agent_id=self.principal.job_agent_id)  # else 404
            self.permission_denied(request)
        row = artifacts.published_artifact(job_id, name,
                                           workspace_id=self.principal.workspace_id)
        etag = f'"{row.sha256}"'
        headers = {"ETag": etag, "Accept-Ranges": "bytes", "X-Content-Type-Options": "nosniff",
                   "Cache-Control": "private, no-transform"}
        if not_modified(request.headers.get("If-None-Match"), etag):
            return HttpResponse(status=status.HTTP_304_NOT_MODIFIED, headers=headers)
        wanted = None
        if request.headers.get("If-Range", etag) == etag:  # else: the whole, current file
            wanted = byte_range(request.headers.get("Range"), row.size)
        if wanted == UNSATISFIABLE:
            return HttpResponse(status=status.HTTP_416_REQUESTED_RANGE_NOT_SATISFIABLE,
                                headers={**headers, "Content-Range": f"bytes */{row.size}"})
        start, end = wanted or (0, row.size - 1)
        if request.method == "HEAD":
            response = HttpResponse(content_type="application/octet-stream")
        else:
            handle = artifacts.open_artifact(row)
            handle.seek(start)
            body = handle if wanted is None else LimitedReader(handle, end - start + 1)
            response = FileResponse(body, content_type="application/octet-stream")
        if wanted is not None:
            response.status_code = status.HTTP_206_PARTIAL_CONTENT
            response["Content-Range"] = f"bytes {start}-{end}/{row.size}"
        response["Content-Length"] = str(end - start + 1)
        response["Content-Disposition"] = content_disposition_header(True, row.name)
        for header, value in headers.items():
            response[header] = value
        return response


READS = ("GET", "HEAD")  # DRF routes HEAD to the GET's method: never the write path
UNSATISFIABLE = "unsatisfiable"
BYTE_RANGE = re.compile(r"([0-9]*)-([0-9]*)")
BEYOND_ANY_SIZE = 10**18


def _position(digits: str) -> int:
    """A range's position; any number too long to be a size is past every end."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else BEYOND_ANY_SIZE


def byte_range(header: str | None, size: int):
    """The one range of RFC 9110 `Range: bytes=a-b` (also `a-` and the suffix `-n`) as
    (start, end) inclusive, UNSATISFIABLE (416: a start at or past the end, a suffix of 0,
    or any range of an empty file), or None: the whole file, for no header, another unit,
    several ranges, or an invalid one (`5-3`, `-`, not numbers), which RFC 9110 lets a
    server ignore."""
    unit, eq, ranges = (header or "").partition("=")
    specs = [spec.strip() for spec in ranges.split(",") if spec.strip()]
    if not eq or unit.strip().lower() != "bytes" or len(specs) != 1:
        return None
    match = BYTE_RANGE.fullmatch(specs[0])
    if match is None or match[1] == match[2] == "":
        return None
    if match[1] == "":  # the last n bytes
        n = _position(match[2])
        return (max(0, size - n), size - 1) if n and size else UNSATISFIABLE
    start = _position(match[1])
    last = _position(match[2]) if match[2] else None
    if last is not None and last < start:
        return None  # invalid: ignored
    if start >= size:
        return UNSATISFIABLE
    return start, size - 1 if last is None else min(last, size - 1)


def not_modified(header: str | None, etag: str) -> bool:
    """Whether If-None-Match names the current file (a 304): `*`, or any of its entity
    tags by RFC 9110's weak comparison (`W/"x"` matches `"x"`)."""
    if header is None:
        return False
    tags = parse_etags(header)
    return tags == ["*"] or etag in {tag.removeprefix("W/") for tag in tags}


class LimitedReader:
    """The next `left` bytes of an open file, for a 206 answer."""

    def __init__(self, handle, left: int):
        self.handle, self.left = handle, left

    def read(self, n=-1):
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.handle.read(n) if n else b""
        self.left -= len(data)
        return data

    def close(self):
        self.handle.close()


def upload_stream(request):
    """The request body as a stream (ClientBody), and its declared length (None for a
    chunked body). A chunked body is read from the server's input when the server marks
    where it ends (gunicorn does); elsewhere it is a 411, as for every other body
    (agents/middleware.py)."""
    meta = request.META
    raw = meta.get("CONTENT_LENGTH")
    if raw not in (None, ""):
        if not DIGITS.fullmatch(raw):
            raise ValidationError({"Content-Length": ["Must be an integer."]})
        return ClientBody(request, int(raw)), int(raw)
    if "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower():
        if not meta.get("wsgi.input_terminated"):
            raise LengthRequired()
        return ClientBody(meta["wsgi.input"], None), None
    return ClientBody(request, 0), 0


def whole_body(request) -> bytes:
    """A small request body (bounded by RequestSizeLimitMiddleware), all of it: one that
    ends before its Content-Length is an IncompleteBody, never a shorter chunk."""
    return ClientBody(request, request.META.get("CONTENT_LENGTH") or None).read()


class LengthRequired(PayloadTooLarge):
    status_code = status.HTTP_411_LENGTH_REQUIRED
    default_detail = "Send a Content-Length header with the request body."
    default_code = "length_required"
