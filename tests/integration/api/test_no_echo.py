"""No error answer quotes what the client sent (issue #17, item 8): a marker string goes
through every field of every request body the OpenAPI schema describes (and the fields of
their arrays' items), as a string, too long, in a list, as an object key, as an unknown UUID,
as a duplicated item; and through malformed JSON, the Content-Type and its charset, the
Idempotency-Key, the method and the query parameters. It never appears in an error answer,
nor in anything the server logs."""

import copy
import json
import logging

import pytest
from rest_framework import serializers
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from agents.serializers.fields import StrictChoiceField

pytestmark = pytest.mark.django_db

MARKER = "zq7marker"  # lower case: DRF lower-cases some of what it quotes (media types)
MARKER_UUID = "7e57ab1e-0000-4000-8000-00000000c0de"


def resolve(doc, node):
    while isinstance(node, dict) and "$ref" in node:
        target = doc
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


class Bodies:
    """Valid bodies built from the schema, and the same with one field replaced."""

    def __init__(self, doc, ids):
        self.doc = doc
        self.ids = ids  # uuid-valued field name -> a real id

    def valid(self, node, name=""):
        node = resolve(self.doc, node)
        if "enum" in node:
            return node["enum"][0]
        if "allOf" in node:
            return self.valid(node["allOf"][0], name)
        kind = node.get("type")
        if kind == "object" and "properties" in node:
            return {key: self.valid(sub, key) for key, sub in node["properties"].items()
                    if key in node.get("required", [])}
        if kind == "object":
            return {}
        if kind == "array":
            return [self.valid(node["items"], name)]
        if kind == "integer":
            return max(1, node.get("minimum", 1))
        if kind == "boolean":
            return False
        if node.get("format") == "uuid":
            return self.ids.get(name, MARKER_UUID)
        if kind == "string":
            return "ok"
        return None

    def variants(self, node):
        """Values that carry the marker, for a field described by `node`."""
        node = resolve(self.doc, node)
        out = [MARKER, [MARKER], {MARKER: MARKER}, {"k": MARKER}, MARKER_UUID]
        if "maxLength" in node:
            out.append(MARKER * (node["maxLength"] // len(MARKER) + 1))
        return out

    def cases(self, body_schema):
        """(label, body) for every field and every variant, at the top level and inside the
        items of array fields."""
        body_schema = resolve(self.doc, body_schema)
        base = self.valid(body_schema)
        for key, sub in body_schema.get("properties", {}).items():
            for value in self.variants(sub):
                yield key, {**base, key: value}
            sub = resolve(self.doc, sub)
            if sub.get("type") == "array":
                item_schema = resolve(self.doc, sub["items"])
                item = self.valid(item_schema)
                for item_key, item_sub in item_schema.get("properties", {}).items():
                    for value in self.variants(item_sub):
                        yield f"{key}[].{item_key}", {**base, key: [{**item, item_key: value}]}
                # The same item twice, its ids the marker UUID.
                twice = copy.deepcopy(item)
                for item_key, item_sub in item_schema.get("properties", {}).items():
                    if resolve(self.doc, item_sub).get("format") == "uuid":
                        twice[item_key] = MARKER_UUID
                yield f"{key}[] twice", {**base, key: [twice, copy.deepcopy(twice)]}


def echoes(response, label, *, marks=(MARKER, MARKER_UUID)) -> list:
    """[(label, status, answer)] when an error answer quotes one of `marks`, else []."""
    if response.status_code < 400:
        return []
    text = response.content.decode("utf-8", "replace").lower()
    return [(label, response.status_code, text[:300])] if any(m in text for m in marks) else []


def assert_no_echo(response, label, **kw):
    assert echoes(response, label, **kw) == []
    return response.status_code >= 400


def test_no_error_answer_or_log_line_quotes_a_body_field(world, target, caplog):
    caplog.set_level(logging.DEBUG)
    r = world.producer().get("/v1/schema/?format=json")
    doc = json.loads(r.content)
    bodies = Bodies(doc, target["ids"])
    producer = world.producer()
    operations, errors, echoed = 0, 0, []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if "application/json" not in op.get("requestBody", {}).get("content", {}):
                continue  # raw bodies (logs, artifacts): test_raw_bodies_and_headers_...
            operations += 1
            url = path.format(**target["path"])
            body_schema = op["requestBody"]["content"]["application/json"]["schema"]
            for label, body in bodies.cases(body_schema):
                response = producer.request(method.upper(), url, json_body=body)
                errors += response.status_code >= 400
                echoed += echoes(response, f"{method} {path} {label}")
    assert not echoed, "\n".join(map(str, echoed))
    assert operations >= 11
    assert errors >= 100  # most variants are refused: the check checked something
    for mark in (MARKER, MARKER_UUID):
        assert mark not in caplog.text.lower()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"claim_id": "zq7marker',
        b'{"zq7marker": }',
        b"zq7marker",
        b'{"claim_id": "zq7marker\xff\xfe"}',
        b'{"claim_id": "zq7marker", "x": NaN}',
        b'{"claim_id": "zq7marker", "x": \\zq7marker}',
        b'{"claim_id": "\\zq7marker"}',
        b'{"claim_id": "zq7marker\x01"}',
        b'{"claim_id": "zq7marker"} zq7marker',
    ],
)
def test_malformed_json_is_never_quoted(world, target, caplog, raw):
    caplog.set_level(logging.DEBUG)
    job_id = target["path"]["job_id"]
    r = world.agent_caller().request("POST", f"jobs/{job_id}/heartbeat", raw=raw)
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert_no_echo(r, raw)
    assert MARKER not in caplog.text.lower()


@pytest.mark.parametrize(
    "content_type",
    [
        "application/zq7marker",
        "text/zq7marker",
        "application/json; charset=zq7marker",
        "application/json; charset=utf-16",
        "application/json; charset=zlib",
        "application/json; charset=utf-7",
    ],
)
def test_the_content_type_and_its_charset_are_never_quoted(world, target, caplog,
                                                           content_type):
    caplog.set_level(logging.DEBUG)
    job_id = target["path"]["job_id"]
    r = world.agent_caller().request("POST", f"jobs/{job_id}/heartbeat",
                                     raw=b'{"claim_id": "zq7marker\xff"}',
                                     content_type=content_type)
    assert r.status_code in (400, 415)
    assert_no_echo(r, content_type, marks=(MARKER, "zlib", "utf-16", "utf-7", "0xff"))
    assert MARKER not in caplog.text.lower()


def test_headers_methods_and_query_parameters_are_never_quoted(world, target, caplog):
    caplog.set_level(logging.DEBUG)
    producer = world.producer()
    agent_id = target["path"]["agent_id"]
    for key in (MARKER * 30, f"{MARKER}\t", f"{MARKER}\x00"):
        r = producer.post("jobs", json={"job_agent_id": str(agent_id)},
                          headers={"Idempotency-Key": key})
        assert r.status_code == 400 and assert_no_echo(r, "Idempotency-Key")
    r = producer.request("ZQ7MARKER", "jobs")
    assert r.status_code == 405 and assert_no_echo(r, "method", marks=(MARKER,))
    for query in ("status", "cursor", "page_size", "job_agent_id"):
        for path in ("jobs", f"job-agents/{agent_id}/jobs"):
            r = producer.get(f"{path}?{query}={MARKER}")
            assert_no_echo(r, f"{path}?{query}")
    assert MARKER not in caplog.text.lower()


class _Probe(serializers.Serializer):
    plain = serializers.ChoiceField(choices=["failure", "successful"], required=False)
    strict = StrictChoiceField(choices=["failure", "successful"], required=False)


class _ProbeView(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def post(self, request):
        _Probe(data=request.data).is_valid(raise_exception=True)


def _probe(body):
    request = APIRequestFactory().post("/v1/probe", body, format="json")
    return _ProbeView.as_view()(request).data


def test_a_message_that_would_still_quote_the_body_is_replaced():
    """The last guard in agents/exceptions.py: a field left with DRF's default message (which
    quotes the value) still answers without it; messages that merely resemble the value
    (a prefix of an allowed one) are left alone."""
    assert _probe({"plain": MARKER}) == {
        "code": "validation_error", "detail": "Invalid input.",
        "fields": {"plain": ["Invalid value."]}}
    assert _probe({"strict": "fail", "plain": "succ"})["fields"] == {
        "strict": ["Must be one of: failure, successful."],
        "plain": ["Invalid value."],
    }


def test_raw_bodies_and_headers_of_outputs_are_never_quoted(world, target, caplog):
    """The log and artifact endpoints take raw bytes and their claim in a header: no error
    answer or log line quotes the body, the claim header, Content-Range or the name."""
    caplog.set_level(logging.DEBUG)
    producer = world.producer()
    job, claim = target["path"]["job_id"], target["ids"]["claim_id"]
    body = f"{MARKER} {MARKER_UUID}".encode()
    cases = [
        ("PATCH", f"jobs/{job}/log", {"X-Claim-Id": MARKER}),
        ("PATCH", f"jobs/{job}/log", {"X-Claim-Id": MARKER_UUID}),
        ("PATCH", f"jobs/{job}/log", {"X-Claim-Id": claim, "Content-Range": MARKER}),
        ("PATCH", f"jobs/{job}/log", {"X-Claim-Id": claim, "Content-Range": "bytes 9-99/*"}),
        ("PUT", f"jobs/{job}/artifacts/{MARKER}%20x", {"X-Claim-Id": claim}),
        ("PUT", f"jobs/{job}/artifacts/a.txt", {"X-Claim-Id": MARKER}),
        ("PUT", f"jobs/{job}/artifacts/a.txt", {"X-Claim-Id": MARKER_UUID}),
        ("GET", f"jobs/{job}/artifacts/{MARKER}", {}),
        ("GET", f"jobs/{job}/log?offset={MARKER}&attempt={MARKER}", {}),
    ]
    statuses = []
    for method, path, headers in cases:
        r = producer.request(method, path, raw=body, content_type=f"text/{MARKER}",
                             headers=headers)
        statuses.append(r.status_code)
        assert_no_echo(r, f"{method} {path} {headers}")
    assert all(s >= 400 for s in statuses), statuses
    # Django's request log names the path (with a name sent in it), never a body or header.
    logged = "\n".join(line for line in caplog.text.lower().splitlines()
                       if f"/artifacts/{MARKER}" not in line and "/log?" not in line)
    for mark in (MARKER, MARKER_UUID):
        assert mark not in logged
