"""jobqueue.lifecycle.inputs: one validator per rule, on typed values (no database)."""

import uuid

import pytest

from jobqueue.exceptions import InvalidInput
from jobqueue.lifecycle import inputs
from jobqueue.lifecycle.inputs import ClaimRef, ReportItem


def refused(call, *args):
    with pytest.raises(InvalidInput) as err:
        call(*args)
    assert err.value.code == "validation_error"
    return err.value


@pytest.mark.parametrize("bad", [4, 10**9, -1, 0.5, 2.0, "60", True, False, None])
def test_bounded_int_takes_only_ints_in_bounds(bad):
    err = refused(inputs.bounded_int, bad, "lease_seconds", 5, 3600)
    assert err.detail == "lease_seconds must be an integer from 5 to 3600."
    assert err.context == {"field": "lease_seconds"}


def test_bounded_int_bounds_are_inclusive():
    assert [inputs.bounded_int(v, "n", 1, 3) for v in (1, 2, 3)] == [1, 2, 3]


def test_every_count_and_duration_is_the_bounded_int_rule_with_its_settings(settings):
    settings.JOBQUEUE = {"MIN_LEASE_SECONDS": 10, "MAX_LEASE_SECONDS": 20, "MAX_MAX_ATTEMPTS": 7,
                         "MAX_CLAIM_BATCH": 4, "MAX_RETRY_AFTER_SECONDS": 30}
    cases = [
        (inputs.lease_seconds, "lease_seconds", 10, 20),
        (inputs.max_attempts, "max_attempts", 1, 7),
        (inputs.claim_limit, "limit", 1, 4),
        (inputs.retry_after_seconds, "retry_after_seconds", 0, 30),
        (inputs.delay_seconds, "delay_seconds", 0, inputs.MAX_DELAY_SECONDS),
    ]
    for check, field, low, high in cases:
        assert check(low) == low and check(high) == high
        for bad in (low - 1, high + 1, str(low), True):
            assert refused(check, bad).detail == (
                f"{field} must be an integer from {low} to {high}."
            )
    # "Not given" is not a value to bound, except for a batch claim's limit.
    for check, *_ in cases[:2] + cases[3:]:
        assert check(None) is None
    refused(inputs.claim_limit, None)


@pytest.mark.parametrize("key", ["", "x" * 256, "a\x00b", "tab\there", "new\nline"])
def test_idempotency_key_is_1_to_255_printable_characters(key):
    assert refused(inputs.idempotency_key, key).context == {"field": "idempotency_key"}


def test_idempotency_key_accepted_or_absent():
    assert inputs.idempotency_key("order-42 ü") == "order-42 ü"
    assert inputs.idempotency_key("k" * 255) == "k" * 255
    assert inputs.idempotency_key(None) is None


def test_agent_name_and_reportable_status():
    assert inputs.agent_name("  build  ") == "build"
    refused(inputs.agent_name, "   ")
    refused(inputs.agent_name, None)
    for status in ("in_progress", "successful", "failure", "cancelled"):
        assert inputs.reportable_status(status) == status
    for status in ("queued", "pending", "expired", "done", None):
        assert refused(inputs.reportable_status, status).context == {"field": "status"}


@pytest.mark.parametrize(
    "value", ["not-a-uuid", "", "12345", None, 12, b"x" * 16, "00000000-0000-4000-8000-00000000000"]
)
def test_parse_uuid_names_none_for_what_is_not_a_uuid(value):
    assert inputs.parse_uuid(value) is None


def test_parse_uuid():
    u = uuid.uuid4()
    assert inputs.parse_uuid(u) is u
    assert inputs.parse_uuid(str(u)) == u and inputs.parse_uuid(u.hex.upper()) == u


def ref():
    return ClaimRef(uuid.uuid4(), uuid.uuid4())


def test_heartbeat_batch_rules(settings):
    settings.JOBQUEUE = {"MAX_HEARTBEAT_BATCH": 3}
    batch = [ref(), ref(), ref()]
    assert inputs.heartbeat_batch(batch) is batch
    assert refused(inputs.heartbeat_batch, []).detail == "claims must be a list of 1 to 3 items."
    refused(inputs.heartbeat_batch, batch + [ref()])
    refused(inputs.heartbeat_batch, "not a list")
    twice = refused(inputs.heartbeat_batch, [batch[0], ref(), ClaimRef(batch[0].job_id,
                                                                        uuid.uuid4())])
    assert twice.detail == "each job_id may appear only once in claims."  # names no id
    assert twice.context == {"field": "claims"}


def report(status="successful", **extra):
    return ReportItem(uuid.uuid4(), uuid.uuid4(), status, **extra)


def test_report_batch_rules(settings):
    settings.JOBQUEUE = {"MAX_REPORT_BATCH": 2}
    ok = [report("failure", message="m", result={"r": 1}), report("cancelled")]
    assert inputs.report_batch(ok) is ok
    refused(inputs.report_batch, [])
    refused(inputs.report_batch, ok + [report()])
    for status in ("in_progress", "expired", "queued"):
        err = refused(inputs.report_batch, [report(status)])
        assert err.detail == "status must be one of: cancelled, failure, successful."
    dup = report()
    assert refused(inputs.report_batch, [dup, dup]).context == {"field": "reports"}


def test_report_item_defaults_mean_not_given():
    item = ReportItem(uuid.uuid4(), uuid.uuid4(), "successful")
    assert (item.message, item.result, item.external_id) == (None, None, None)
    with pytest.raises(AttributeError):
        item.status = "failure"  # frozen


def test_report_content_caps_the_message_in_utf8_bytes_and_the_result_as_compact_json(
        settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_MESSAGE_BYTES": 10, "MAX_RESULT_BYTES": 12}
    inputs.report_content(None, None)
    inputs.report_content("é" * 5, {"a": [1, 2]})  # 10 bytes; {"a":[1,2]} is 11
    with pytest.raises(InvalidInput) as err:
        inputs.report_content("é" * 5 + "x", None)
    assert err.value.context["field"] == "message" and "10 bytes" in err.value.detail
    with pytest.raises(InvalidInput) as err:
        inputs.report_content(None, {"a": "é" * 4})  # {"a":"éééé"}: 8 + 8 bytes
    assert err.value.context["field"] == "result" and "12 bytes" in err.value.detail
    assert inputs.json_size({"a": "é"}) == len('{"a":"é"}'.encode())
    # A lone surrogate is measured, never an error of its own.
    assert inputs.json_size("\ud800") == 5
    with pytest.raises(InvalidInput):
        inputs.report_content("\ud800" * 4, None)
    with pytest.raises(InvalidInput) as err:
        inputs.report_batch([ReportItem(uuid.uuid4(), uuid.uuid4(), "successful",
                                        result=["x" * 20])])
    assert err.value.context["field"] == "result"


def test_uniqueness_defaults_and_options():
    assert inputs.uniqueness(None) is None
    plain = inputs.uniqueness("nightly")
    assert plain == inputs.Uniqueness("nightly")
    assert plain.live == {"pending", "queued", "in_progress"} and not plain.replace
    full = inputs.uniqueness("k", ["queued"], "replace", 60, 60)
    assert full == inputs.Uniqueness("k", frozenset({"queued"}), True, 60, 60)
    assert inputs.uniqueness("k", on_conflict="skip").replace is False


@pytest.mark.parametrize(("args", "field"), [
    ((None, ["queued"]), "unique_states"),
    ((None, None, "skip"), "on_conflict"),
    ((None, None, None, 5), "debounce_seconds"),
    ((None, None, None, None, 5), "debounce_max_seconds"),
    (("",), "unique_key"),
    (("k" * 256,), "unique_key"),
    (("new\nline",), "unique_key"),
    ((7,), "unique_key"),
    (("k", []), "unique_states"),
    (("k", "queued"), "unique_states"),
    (("k", ["queued", "successful"]), "unique_states"),
    (("k", None, "merge"), "on_conflict"),
    (("k", None, None, 0), "debounce_seconds"),
    (("k", None, None, 86_401), "debounce_seconds"),
    (("k", None, None, True), "debounce_seconds"),
    (("k", ["pending"], None, 5), "debounce_seconds"),
    (("k", None, None, None, 5), "debounce_max_seconds"),
    (("k", None, None, 10, 9), "debounce_max_seconds"),
    (("k", None, None, 10, 7 * 86_400 + 1), "debounce_max_seconds"),
])
def test_uniqueness_refuses_each_bad_option_naming_it(args, field):
    assert refused(inputs.uniqueness, *args).context == {"field": field}


def test_concurrency_defaults_the_limit_to_1_with_a_key_and_none_without():
    assert inputs.concurrency(None) == (None, None)
    assert inputs.concurrency(None, None) == (None, None)
    assert inputs.concurrency("deploy:prod") == ("deploy:prod", 1)
    assert inputs.concurrency("k", 5) == ("k", 5)
    assert inputs.concurrency("k" * 255, 1000) == ("k" * 255, 1000)


@pytest.mark.parametrize(("args", "field"), [
    ((None, 2), "concurrency_limit"),
    (("",), "concurrency_key"),
    (("k" * 256,), "concurrency_key"),
    (("new\nline",), "concurrency_key"),
    ((7,), "concurrency_key"),
    ((["k"],), "concurrency_key"),
    (("k", 0), "concurrency_limit"),
    (("k", 1001), "concurrency_limit"),
    (("k", -1), "concurrency_limit"),
    (("k", "2"), "concurrency_limit"),
    (("k", 2.0), "concurrency_limit"),
    (("k", True), "concurrency_limit"),
])
def test_concurrency_refuses_each_bad_value_naming_it(args, field):
    assert refused(inputs.concurrency, *args).context == {"field": field}


def test_a_rate_limit_needs_its_count_and_its_period():
    assert refused(inputs.rate_limit, None, 60).context == {"field": "count"}
    assert refused(inputs.rate_limit, 5, None).context == {"field": "period_seconds"}
    assert refused(inputs.rate_limit, 0, 60).context == {"field": "count"}
    assert refused(inputs.rate_limit, 5, 86_401).context == {"field": "period_seconds"}
    assert inputs.rate_limit(100_000, 86_400) == (100_000, 86_400)


def test_a_fairness_weight_is_1_to_100_and_required():
    assert refused(inputs.fairness_weight, None).context == {"field": "weight"}
    assert refused(inputs.fairness_weight, 101).context == {"field": "weight"}
    assert inputs.fairness_weight(100) == 100


def test_flow_control_keys_are_1_to_255_printable_characters():
    assert inputs.fairness_key(None) is None and inputs.rate_limit_key(None) is None
    assert inputs.fairness_key("acme") == "acme"
    for bad in ("", "x" * 256, "a\nb", 5):
        assert refused(inputs.fairness_key, bad).context == {"field": "fairness_key"}
        assert refused(inputs.rate_limit_key, bad).context == {"field": "rate_limit_key"}


def test_the_rest_of_path_converter_gives_the_key_back_as_it_came():
    from agents.urls import RestOfPath

    assert RestOfPath().to_python("a/b c") == "a/b c"
    assert RestOfPath().to_url("50% off") == "50% off"
