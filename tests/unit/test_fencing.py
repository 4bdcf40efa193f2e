"""Fencing tokens without a database: the server's signing and key set (jobqueue/fencing.py),
the client's offline verifier (jobqueue_client.fencing) and its fenced store, and the bad
inputs a verifier meets (malformed, foreign-signed, expired, another workspace or issuer)."""

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import ImproperlyConfigured
from jobqueue_client import (
    FencingTokenError,
    FencingUnavailable,
    fenced_store,
    fetch_jwks,
    verify_fencing_token,
)
from jobqueue_client import fencing as client_fencing
from jobqueue_client.client import Claim
from jobqueue_client.fenced_store import FencedStore, StaleAttempt, serve

from jobqueue import fencing

ROOT = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
WS = str(uuid.uuid4())


@dataclass
class FakeJob:
    id: uuid.UUID
    workspace_id: uuid.UUID


@dataclass
class FakeGrant:
    job: FakeJob
    claim_id: uuid.UUID
    attempt: int
    claimed_at: dt.datetime
    claim_expires_at: dt.datetime


def grant(attempt=1, job_id=None, workspace_id=WS, lease=60, at=T0):
    return FakeGrant(FakeJob(job_id or uuid.uuid4(), uuid.UUID(workspace_id)), uuid.uuid4(),
                     attempt, at, at + dt.timedelta(seconds=lease))


def pem_file(path: Path, key=None, public=False) -> Path:
    key = key or Ed25519PrivateKey.generate()
    if public:
        data = key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    else:
        data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    path.write_bytes(data)
    return path


@pytest.fixture
def keyfiles(tmp_path, settings):
    """Two keys configured: the first signs, the second is only published."""
    files = [pem_file(tmp_path / "new.pem"), pem_file(tmp_path / "old.pem")]
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(f) for f in files]}
    return files


def at(seconds):
    return T0 + dt.timedelta(seconds=seconds)


# --- the server side ----------------------------------------------------------------------


def test_a_token_carries_the_contracts_payload_and_header(keyfiles):
    g = grant(attempt=3)
    token = fencing.token_for(g)
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "EdDSA" and header["kid"] == fencing.signing_key().kid
    payload = jwt.decode(token, options={"verify_signature": False})
    assert payload == {
        "iss": "jobqueue", "job_id": str(g.job.id), "workspace_id": WS, "attempt": 3,
        "claim_id": str(g.claim_id), "iat": int(T0.timestamp()),
        # the lease's end at claim time, rounded down: never later than the lease
        "exp": int(T0.timestamp()) + 60,
    }


def test_the_key_set_publishes_every_key_by_its_thumbprint_and_nothing_private(keyfiles):
    published = fencing.jwks()["keys"]
    assert [k["kid"] for k in published] == [k.kid for k in fencing.keys()]
    assert len(published) == 2
    for jwk in published:
        assert set(jwk) == {"kty", "crv", "x", "kid", "alg", "use"}
        assert (jwk["kty"], jwk["crv"], jwk["alg"], jwk["use"]) == ("OKP", "Ed25519", "EdDSA",
                                                                    "sig")
    # RFC 7638, section 3.1's method, by hand: sha256 over the sorted required members.
    import base64
    import hashlib
    first = published[0]
    canonical = f'{{"crv":"Ed25519","kty":"OKP","x":"{first["x"]}"}}'.encode()
    assert first["kid"] == base64.urlsafe_b64encode(
        hashlib.sha256(canonical).digest()).rstrip(b"=").decode()


def test_rotation_a_token_of_the_retired_key_still_verifies_while_it_is_published(
        tmp_path, settings):
    old = pem_file(tmp_path / "old.pem")
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(old)]}
    old_token = fencing.token_for(grant())
    old_set = fencing.jwks()
    # Rotate: a new key signs; the old one stays published (as a public key only).
    new = pem_file(tmp_path / "new.pem")
    old_public = pem_file(tmp_path / "old.pub.pem",
                          serialization.load_pem_private_key(old.read_bytes(), None), public=True)
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "FENCING_KEY_FILES": [str(new), str(old_public)]}
    new_set = fencing.jwks()
    new_token = fencing.token_for(grant())
    assert jwt.get_unverified_header(new_token)["kid"] != jwt.get_unverified_header(
        old_token)["kid"]
    assert [k["kid"] for k in new_set["keys"]][1] == old_set["keys"][0]["kid"]
    for token in (old_token, new_token):
        verify_fencing_token(token, new_set, check_expiry=False)
    # A verifier still holding only the old set meets the new kid: a clear error.
    with pytest.raises(FencingTokenError, match="does not hold") as exc:
        verify_fencing_token(new_token, old_set, check_expiry=False)
    assert exc.value.reason == "unknown_key"


def test_a_public_key_cannot_sign_and_junk_is_refused_at_configuration(tmp_path, settings):
    public = pem_file(tmp_path / "pub.pem", public=True)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(public)]}
    with pytest.raises(ImproperlyConfigured, match="private key"):
        fencing.keys()
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(junk)]}
    with pytest.raises(ImproperlyConfigured, match="openssl genpkey"):
        fencing.keys()
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(tmp_path / "none")]}
    with pytest.raises(ImproperlyConfigured, match="cannot read"):
        fencing.keys()
    key = pem_file(tmp_path / "k.pem")
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(key), str(key)]}
    with pytest.raises(ImproperlyConfigured, match="twice"):
        fencing.keys()


def test_a_published_key_file_that_holds_no_key_is_refused(tmp_path, settings):
    """Only published (not first): a public key will do, junk will not."""
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n")
    signing = str(pem_file(tmp_path / "k.pem"))
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [signing, str(junk)]}
    with pytest.raises(ImproperlyConfigured, match=f"{junk} is not an Ed25519 key in PEM"):
        fencing.keys()


class Gate:
    """Stands for fencing._lock: says when a thread is about to wait for it."""

    def __init__(self):
        self.lock, self.waiting = threading.Lock(), threading.Event()

    def __enter__(self):
        self.waiting.set()
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def test_a_thread_that_waited_while_another_loaded_the_keys_takes_those(keyfiles, monkeypatch):
    """Two threads' first tokens at once: the one that waited for the lock reads what the
    other loaded (the same key objects), it does not load the files again."""
    gate = Gate()
    monkeypatch.setattr(fencing, "_lock", gate)
    loaded = []
    with gate.lock:
        waiter = threading.Thread(target=lambda: loaded.append(fencing.keys()))
        waiter.start()
        assert gate.waiting.wait(10)
        for path in keyfiles:  # whatever it reads from here on is not a key
            path.write_text("")
        fencing._cache[fencing._key_files()] = first = (
            fencing._load(pem_file(keyfiles[0].with_name("x.pem")), must_sign=True),)
    waiter.join(timeout=10)
    assert loaded == [first] and loaded[0][0] is first[0]


def test_unset_a_key_is_generated_under_var_once_mode_0600(tmp_path, settings):
    settings.VAR_DIR = tmp_path / "var"
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": []}
    [key] = fencing.keys()
    path = tmp_path / "var" / "fencing_key.pem"
    assert path.stat().st_mode & 0o777 == 0o600
    assert key.private_key is not None
    before = path.read_bytes()
    fencing._cache.clear()
    assert fencing.keys()[0].kid == key.kid and path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["fencing_key.pem"]  # no leftovers


def test_a_key_written_by_another_process_after_the_check_is_the_one_kept(tmp_path):
    """The file appears between generate_key_file's exists() and its link (another process
    was first): that key stays, this one's temporary file is gone. (The processes below race
    for real, but need not meet in that window.)"""
    path = tmp_path / "fencing_key.pem"
    pem_file(path)
    before = path.read_bytes()

    class SeenLate(type(path)):
        def exists(self, **kwargs):
            return False  # as it was when this process looked

    fencing.generate_key_file(SeenLate(path))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["fencing_key.pem"]


def test_processes_starting_at_once_agree_on_one_generated_key(tmp_path):
    """Eight processes generate the key at the same moment: one file, the same key for all."""
    path = tmp_path / "fencing_key.pem"
    code = ("import sys, time; from pathlib import Path; from jobqueue import fencing; "
            "t = float(sys.argv[2]); time.sleep(max(0, t - time.time())); "
            "fencing.generate_key_file(Path(sys.argv[1])); "
            "print(fencing._load(Path(sys.argv[1]), must_sign=True).kid)")
    import time
    start = time.time() + 1.5
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(start)],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(8)]
    kids = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(kids) == 1 and "" not in kids
    assert [p.name for p in tmp_path.iterdir()] == ["fencing_key.pem"]


def test_the_issuer_comes_from_settings(keyfiles, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_ISSUER": "https://jobs.example"}
    token = fencing.token_for(grant())
    with pytest.raises(FencingTokenError, match="issued by 'https://jobs.example'") as exc:
        verify_fencing_token(token, fencing.jwks(), check_expiry=False)
    assert exc.value.reason == "wrong_issuer"
    claims = verify_fencing_token(token, fencing.jwks(), issuer="https://jobs.example",
                                  check_expiry=False)
    assert claims.issuer == "https://jobs.example"


# --- the client's verifier ----------------------------------------------------------------


def test_a_token_verifies_offline_with_its_claims(keyfiles):
    g = grant(attempt=2)
    claims = verify_fencing_token(fencing.token_for(g), fencing.jwks(), workspace_id=WS,
                                  now=at(59))
    assert (claims.job_id, claims.workspace_id, claims.attempt, claims.claim_id) == (
        str(g.job.id), WS, 2, str(g.claim_id))
    assert claims.expires_at == at(60).replace(microsecond=0)
    assert claims.issued_at == T0.replace(microsecond=0)


def test_an_expired_token_is_refused_unless_expiry_is_not_checked(keyfiles):
    token = fencing.token_for(grant(lease=60))
    exp = int(T0.timestamp()) + 60
    now = dt.datetime.fromtimestamp(exp, dt.UTC)
    with pytest.raises(FencingTokenError, match="expired at") as exc:
        verify_fencing_token(token, fencing.jwks(), now=now)
    assert exc.value.reason == "expired"
    verify_fencing_token(token, fencing.jwks(), now=now, leeway=5)
    verify_fencing_token(token, fencing.jwks(), check_expiry=False)


def test_a_token_of_another_workspace_is_refused(keyfiles):
    token = fencing.token_for(grant())
    other = str(uuid.uuid4())
    with pytest.raises(FencingTokenError, match=f"not '{other}'") as exc:
        verify_fencing_token(token, fencing.jwks(), workspace_id=other, check_expiry=False)
    assert exc.value.reason == "wrong_workspace"


def test_a_foreign_signed_token_is_refused(keyfiles, tmp_path):
    """Signed by a key the service does not have: under a kid the set does not hold, or
    (forged) under the service's own kid."""
    foreign = Ed25519PrivateKey.generate()
    payload = jwt.decode(fencing.token_for(grant()), options={"verify_signature": False})
    unknown = jwt.encode(payload, foreign, algorithm="EdDSA", headers={"kid": "someone-else"})
    with pytest.raises(FencingTokenError, match="'someone-else', which the key set does not"
                       ) as exc:
        verify_fencing_token(unknown, fencing.jwks(), check_expiry=False)
    assert exc.value.reason == "unknown_key"
    forged = jwt.encode({**payload, "attempt": 99}, foreign, algorithm="EdDSA",
                        headers={"kid": fencing.signing_key().kid})
    with pytest.raises(FencingTokenError, match="signature does not verify") as exc:
        verify_fencing_token(forged, fencing.jwks(), check_expiry=False)
    assert exc.value.reason == "bad_signature"


def test_an_altered_payload_does_not_verify(keyfiles):
    import base64
    header, body, sig = fencing.token_for(grant(attempt=1)).split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["attempt"] = 7
    raised = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    with pytest.raises(FencingTokenError) as exc:
        verify_fencing_token(f"{header}.{raised}.{sig}", fencing.jwks(), check_expiry=False)
    assert exc.value.reason == "bad_signature"


@pytest.mark.parametrize("token, message", [
    ("", "not a compact JWS"),
    ("abc", "not a compact JWS"),
    (None, "not a compact JWS"),
    ("a.b.c", "malformed fencing token"),
    ("eyJhbGciOiJFZERTQSJ9.e30.AAAA", "no kid"),  # {"alg": "EdDSA"}, {}
    ("eyJhbGciOiJIUzI1NiIsImtpZCI6ImsifQ.e30.AAAA", "only EdDSA"),  # HS256
    ("eyJhbGciOiJub25lIiwia2lkIjoiayJ9.e30.", "only EdDSA"),  # alg none
])
def test_a_malformed_token_gets_a_clear_error(keyfiles, token, message):
    with pytest.raises(FencingTokenError, match=message) as exc:
        verify_fencing_token(token, fencing.jwks())
    assert exc.value.reason == "malformed"
    assert str(exc.value).startswith(("malformed fencing token", "fencing token algorithm"))


def test_a_signed_token_missing_members_or_with_a_bad_attempt_is_malformed(keyfiles):
    key = fencing.signing_key()
    full = jwt.decode(fencing.token_for(grant()), options={"verify_signature": False})

    def signed(payload):
        return jwt.encode(payload, key.private_key, algorithm="EdDSA", headers={"kid": key.kid})

    with pytest.raises(FencingTokenError, match="no attempt, claim_id in its payload"):
        verify_fencing_token(signed({k: v for k, v in full.items()
                                     if k not in ("attempt", "claim_id")}), fencing.jwks())
    for attempt in ("3", 1.5, True, None):
        with pytest.raises(FencingTokenError, match="attempt an integer"):
            verify_fencing_token(signed({**full, "attempt": attempt}), fencing.jwks(),
                                 check_expiry=False)


def signed_raw(payload: bytes) -> str:
    """A token of the service's signing key over `payload` as it is (any bytes, not only
    what json.dumps writes: 1e999, NaN, a list)."""
    key = fencing.signing_key()
    return jwt.api_jws.PyJWS().encode(payload, key.private_key, algorithm="EdDSA",
                                      headers={"kid": key.kid})


@pytest.mark.parametrize("member, value", [
    ("exp", "1e999"), ("exp", "-1e999"), ("exp", "NaN"), ("exp", "1e300"), ("exp", "1" * 400),
    ("iat", "1e300"), ("iat", "Infinity"), ("attempt", "1e999"),
])
def test_a_signed_token_with_a_time_no_datetime_holds_is_malformed(keyfiles, member, value):
    """exp / iat out of any datetime's range (huge, infinite, NaN) or an infinite attempt:
    refused as malformed, with or without the expiry check, never an OverflowError or a bare
    ValueError from the conversion."""
    full = jwt.decode(fencing.token_for(grant()), options={"verify_signature": False})
    raw = json.dumps({**full, member: "@"}).replace('"@"', value).encode()
    for check_expiry in (True, False):
        with pytest.raises(FencingTokenError, match="datetime can hold") as exc:
            verify_fencing_token(signed_raw(raw), fencing.jwks(), check_expiry=check_expiry)
        assert exc.value.reason == "malformed"


def test_a_signed_payload_that_is_not_an_object_is_malformed(keyfiles):
    with pytest.raises(FencingTokenError, match="malformed fencing token") as exc:
        verify_fencing_token(signed_raw(b"[1]"), fencing.jwks())
    assert exc.value.reason == "malformed"


def test_the_key_set_must_be_a_jwk_set(keyfiles):
    token = fencing.token_for(grant())
    with pytest.raises(TypeError, match="JWK set"):
        verify_fencing_token(token, {"nope": 1})
    wrong_kind = {"keys": [{"kid": fencing.signing_key().kid, "kty": "RSA"}]}
    with pytest.raises(FencingTokenError, match="not an Ed25519 key"):
        verify_fencing_token(token, wrong_kind)
    broken = {"keys": [{"kid": fencing.signing_key().kid, "kty": "OKP", "crv": "Ed25519",
                        "x": "!!"}]}
    with pytest.raises(FencingTokenError, match="not a usable Ed25519 key"):
        verify_fencing_token(token, broken)
    # A bare list of JWKs is a key set too.
    verify_fencing_token(token, fencing.jwks()["keys"], check_expiry=False)


def test_without_the_extra_the_verifier_names_it(keyfiles, monkeypatch):
    token = fencing.token_for(grant())
    monkeypatch.setitem(sys.modules, "jwt", None)  # import jwt -> ImportError
    with pytest.raises(FencingUnavailable, match=r"jobqueue-client\[fencing\]"):
        verify_fencing_token(token, fencing.jwks())


def test_the_claim_object_carries_the_token():
    payload = {"job": {"id": "j"}, "claim": {
        "claim_id": "c", "lease_seconds": 60, "claim_expires_at": "2026-01-01T00:01:00Z",
        "server_time": "2026-01-01T00:00:00Z", "attempt": 1, "fencing_token": "a.b.c"}}
    claim = Claim.from_payload(payload)
    assert claim.fencing_token == "a.b.c" and "a.b.c" not in repr(claim)
    del payload["claim"]["fencing_token"]
    assert Claim.from_payload(payload).fencing_token is None


def test_fetch_jwks_reads_the_well_known_path():
    seen = []

    def handler(request):
        seen.append(request.url.path)
        return httpx.Response(200, json={"keys": []})

    assert fetch_jwks("http://svc/", transport=httpx.MockTransport(handler)) == {"keys": []}
    assert seen == ["/v1/.well-known/jwks.json"]


# --- the fenced store ---------------------------------------------------------------------


def test_the_fenced_store_refuses_a_lower_attempt_and_accepts_equal_or_higher(keyfiles):
    store = FencedStore(fencing.jwks(), workspace_id=WS)
    job = uuid.uuid4()
    first, second = grant(1, job), grant(2, job)
    store.write(fencing.token_for(first), "out", "from 1")
    store.write(fencing.token_for(first), "out", "from 1 again")  # the same attempt: fine
    store.write(fencing.token_for(second), "out", "from 2")
    with pytest.raises(StaleAttempt, match="attempt 1 is stale, the store has seen attempt 2"):
        store.write(fencing.token_for(first), "out", "late from 1")
    assert store.read("out").value == "from 2" and store.read("out").attempt == 2
    assert store.highest_attempt(str(job)) == 2
    # Another job's attempts are its own.
    store.write(fencing.token_for(grant(1)), "other", "x")
    # The store's tokens are old (T0): it does not look at exp, the attempt order fences.
    assert store.read("missing") is None


def test_the_fenced_store_fetches_the_key_set_again_for_a_rotated_key_at_most_once_a_while(
        tmp_path, settings, monkeypatch):
    old = pem_file(tmp_path / "old.pem")
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(old)]}
    fetched = []

    def refresh():
        fetched.append(1)
        return fencing.jwks()

    store = FencedStore(fencing.jwks(), workspace_id=WS, refresh=refresh)
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "FENCING_KEY_FILES": [str(pem_file(tmp_path / "new.pem")), str(old)]}
    job = uuid.uuid4()
    # Signed by the service's new key, which the store's set does not hold yet.
    assert store.write(fencing.token_for(grant(2, job)), "out", "x").attempt == 2
    assert len(fetched) == 1
    # A token of a key nobody publishes: the set was fetched just now, so not again.
    published = settings.JOBQUEUE["FENCING_KEY_FILES"]
    stranger = pem_file(tmp_path / "stranger.pem")
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(stranger)]}
    forged = fencing.token_for(grant(3, job))
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": published}
    with pytest.raises(FencingTokenError) as exc:
        store.write(forged, "out", "y")
    assert exc.value.reason == "unknown_key" and len(fetched) == 1
    # A while later it is fetched again (and still does not hold it).
    monkeypatch.setattr(fenced_store, "REFRESH_SECONDS", 0.0)
    with pytest.raises(FencingTokenError):
        store.write(forged, "out", "y")
    assert len(fetched) == 2 and store.read("out").value == "x"
    # Without `refresh`, a store keeps the set it was given.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(old)]}
    fixed = FencedStore(fencing.jwks(), workspace_id=WS)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": published}
    with pytest.raises(FencingTokenError):
        fixed.write(fencing.token_for(grant(1)), "k", 1)


def test_the_fenced_store_refuses_bad_tokens(keyfiles):
    store = FencedStore(fencing.jwks(), workspace_id=WS)
    with pytest.raises(FencingTokenError):
        store.write("nonsense", "k", 1)
    with pytest.raises(FencingTokenError, match="workspace"):
        store.write(fencing.token_for(grant(workspace_id=str(uuid.uuid4()))), "k", 1)
    assert store.read("k") is None


def test_the_fenced_store_over_http(keyfiles):
    store = FencedStore(fencing.jwks(), workspace_id=WS)
    httpd = serve(store)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        job = uuid.uuid4()
        ok = httpx.post(f"{url}/write", json={"token": fencing.token_for(grant(2, job)),
                                              "key": "k", "value": [1]})
        assert ok.status_code == 200 and ok.json()["attempt"] == 2
        stale = httpx.post(f"{url}/write", json={"token": fencing.token_for(grant(1, job)),
                                                 "key": "k", "value": [0]})
        assert stale.status_code == 409
        assert stale.json()["code"] == "stale_attempt"
        assert stale.json()["highest_attempt"] == 2
        bad = httpx.post(f"{url}/write", json={"token": "x.y.z", "key": "k"})
        assert bad.status_code == 401 and bad.json()["reason"] == "malformed"
        assert httpx.post(f"{url}/write", content=b"{").status_code == 400
        assert httpx.post(f"{url}/other", json={}).status_code == 404
        read = httpx.get(f"{url}/read", params={"key": "k"})
        assert read.json()["value"] == [1] and read.json()["attempt"] == 2
        assert httpx.get(f"{url}/read", params={"key": "no"}).status_code == 404
        assert httpx.get(f"{url}/else").status_code == 404
    finally:
        httpd.shutdown()
        httpd.server_close()


def raw_post(port: int, headers: str) -> tuple[int, dict]:
    """POST /write with these headers and no body, as raw HTTP: (status, JSON body)."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST /write HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_the_fenced_store_refuses_a_body_too_large_or_of_no_length_unread(keyfiles):
    """Its body is read whole, so a Content-Length over MAX_BODY_BYTES is refused (413)
    before any of it is read, and one that is no byte count (negative: read to EOF) is a 400;
    the connection is closed (the unread body is no next request). At the limit: read."""
    from jobqueue_client import fenced_store
    httpd = serve(FencedStore(fencing.jwks(), workspace_id=WS))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    try:
        status, body = raw_post(port, f"Content-Length: {fenced_store.MAX_BODY_BYTES + 1}\r\n")
        assert status == 413 and body["code"] == "payload_too_large"
        for length in ("-1", "many"):
            status, body = raw_post(port, f"Content-Length: {length}\r\n")
            assert status == 400 and body["code"] == "bad_request"
        value = "x" * (fenced_store.MAX_BODY_BYTES - 2000)
        ok = httpx.post(f"http://127.0.0.1:{port}/write", json={
            "token": fencing.token_for(grant(1)), "key": "k", "value": value})
        assert ok.status_code == 200
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_the_fenced_store_command_fetches_the_key_set_once_and_stops_on_ctrl_c(keyfiles, stop):
    """`python -m jobqueue_client.fenced_store`: the key set from --server at start, writes
    verified against it, --workspace enforced; SIGINT (ctrl-c) or SIGTERM ends it cleanly
    (status 0), even started with SIGINT ignored (as a script's background process is: it
    once hung so in the newcomer test, whose pytest ran in the background of `make test`)."""
    import signal
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    fetched = []
    published = json.dumps(fencing.jwks()).encode()

    class Service(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            fetched.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(published)))
            self.end_headers()
            self.wfile.write(published)

        def log_message(self, *args):
            pass

    service = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobqueue_client.fenced_store", "--server",
         f"http://127.0.0.1:{service.server_address[1]}", "--workspace", WS, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        line = proc.stdout.readline()
        assert line.startswith("fenced store listening on http://127.0.0.1:"), proc.stderr.read()
        url = line.split()[-1]
        job = uuid.uuid4()
        assert httpx.post(f"{url}/write", json={"token": fencing.token_for(grant(2, job)),
                                                "key": "k", "value": 1}).status_code == 200
        other = fencing.token_for(grant(3, job, workspace_id=str(uuid.uuid4())))
        refused = httpx.post(f"{url}/write", json={"token": other, "key": "k", "value": 2})
        assert refused.status_code == 401 and refused.json()["reason"] == "wrong_workspace"
        assert httpx.get(f"{url}/read", params={"key": "k"}).json()["value"] == 1
        proc.send_signal(getattr(signal, stop))
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        assert fetched == ["/v1/.well-known/jwks.json"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        service.shutdown()
        service.server_close()


def test_the_client_module_imports_without_the_extra():
    """The base install is httpx-only: importing the package (and the fencing modules) never
    needs PyJWT; only verifying does."""
    code = ("import sys; sys.modules['jwt'] = None; import jobqueue_client, "
            "jobqueue_client.fenced_store; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    assert client_fencing.EXTRA == "pip install 'jobqueue-client[fencing]'"


def test_the_system_check_names_a_bad_key_file(tmp_path, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": []}
    settings.VAR_DIR = tmp_path / "var"
    assert fencing.check_keys() == []  # unset: the check makes the key, not the first claim
    assert (tmp_path / "var" / "fencing_key.pem").stat().st_mode & 0o777 == 0o600
    (tmp_path / "file").write_text("")
    settings.VAR_DIR = tmp_path / "file" / "var"  # a var/ that cannot be made
    [error] = fencing.check_keys()
    assert error.id == "jobqueue.W001" and "JOBQUEUE_FENCING_KEY_FILES" in error.msg
    assert str(tmp_path / "file" / "var" / "fencing_key.pem") in error.msg
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(tmp_path / "gone")]}
    [error] = fencing.check_keys()
    assert error.id == "jobqueue.E001" and "cannot read" in error.msg
    settings.JOBQUEUE = {**settings.JOBQUEUE,
                         "FENCING_KEY_FILES": [str(pem_file(tmp_path / "k.pem"))]}
    assert fencing.check_keys() == []
