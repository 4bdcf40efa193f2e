"""jobqueue.redaction: which strings of a dispatch_context are secrets, and how agent text is
shown without them (whole occurrences, and the pieces a cut splits)."""

from jobqueue.redaction import (
    REDACTED,
    redact_job_document,
    redact_text,
    redact_value,
    secret_strings,
)

CONTEXT = {"env": {"TOKEN": "hunter2-secret", "short": "abc"}, "list": ["tok-in-list", 7],
           "hunter2-key-is-no-secret": None}


def test_secrets_are_the_strings_of_four_characters_or_more_at_any_depth_longest_first():
    assert secret_strings(CONTEXT) == ["hunter2-secret", "tok-in-list"]
    assert secret_strings(None) == [] and secret_strings("just-a-string") == ["just-a-string"]


def test_text_loses_whole_secrets_and_the_pieces_its_ends_cut():
    secrets = secret_strings(CONTEXT)
    assert redact_text("a hunter2-secret b tok-in-list", secrets) == \
        f"a {REDACTED} b {REDACTED}"
    # The start may be inside a secret (a tail of the output), the end too (a cut).
    assert redact_text("2-secret then hunte", secrets) == f"{REDACTED} then {REDACTED}"
    assert redact_text("2-secret then", secrets, cut=False) == "2-secret then"
    assert redact_text("ends in hu", secrets) == "ends in hu"  # two characters: kept
    assert redact_text("nothing here", []) == "nothing here"


def test_json_values_lose_whole_secrets_in_every_string_and_key():
    secrets = secret_strings(CONTEXT)
    value = {"out": ["x hunter2-secret", 1, None], "tok-in-list": {"n": "hunte"}}
    assert redact_value(value, secrets) == {"out": [f"x {REDACTED}", 1, None],
                                            REDACTED: {"n": "hunte"}}
    assert redact_value(value, []) is value


def test_a_job_document_loses_them_in_message_external_id_and_result_only():
    secrets = secret_strings(CONTEXT)
    doc = {"id": "j", "message": "2-secret, then hunter2-secret", "external_id": "x-tok-in-list",
           "result": {"k": "hunter2-secret"}, "job_agent_config": {"k": "hunter2-secret"}}
    assert redact_job_document(doc, secrets) == {
        "id": "j", "message": f"{REDACTED}, then {REDACTED}",
        "external_id": f"x-{REDACTED}", "result": {"k": REDACTED},
        "job_agent_config": {"k": "hunter2-secret"}}  # the producer's own text
    assert redact_job_document(doc, []) is doc


def test_a_job_document_keeps_what_is_not_agent_text():
    secrets = secret_strings(CONTEXT)
    doc = {"message": None, "external_id": "ext hunter2-secret", "status": "queued"}
    assert redact_job_document(doc, secrets) == {"message": None,
                                                 "external_id": f"ext {REDACTED}",
                                                 "status": "queued"}
    assert redact_job_document(doc, []) is doc


def test_a_log_slice_reads_redacted_and_a_tail_says_it_is_cut():
    from jobqueue.lifecycle.logs import LogSlice

    whole = LogSlice(attempt=1, length=20, offset=0, data=b"2-secret \xff hunter2-secret")
    assert whole.redacted_text(["hunter2-secret"]) == f"2-secret \ufffd {REDACTED}"
    tail = LogSlice(attempt=1, length=40, offset=26, data=b"2-secret ok hunte")
    assert tail.redacted_text(["hunter2-secret"]) == f"…{REDACTED} ok {REDACTED}"
    assert tail.redacted_text([]) == "…2-secret ok hunte"
