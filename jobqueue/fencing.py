"""Verifiable fencing tokens (DESIGN.md, "Effects and verifiable fencing").

Every claim answer carries `claim.fencing_token`: a compact JWS, EdDSA over Ed25519, whose
header names the signing key (`kid`, its RFC 7638 thumbprint) and whose payload is

    {"iss", "job_id", "workspace_id", "attempt", "claim_id", "iat", "exp"}

`iat` is the claim's time and `exp` the lease's end at claim time, both from the database's
clock (the values the claim statement returned), as whole seconds (exp rounded down: the token
never outlives the lease it was given with). `attempt` only grows for a job, so it orders the
job's claims: an outside resource that refuses an attempt lower than the highest it has seen
fences off a stale worker without asking the service (jobqueue_client.fenced_store).

Keys (JOBQUEUE_FENCING_KEY_FILES): PEM files, the first one an Ed25519 private key (it signs),
the others private or public keys that are only published (GET /v1/.well-known/jwks.json), so
that tokens signed by a retired key still verify while they may live. Unset: one private key
generated at first use in var/fencing_key.pem (mode 0600), like the secret key; several
processes starting at once agree on the first one written.

No HTTP here: the edge (agents) renders the token and serves the key set.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from jobqueue.conf import jobqueue_settings

ALGORITHM = "EdDSA"
GENERATED_KEY_NAME = "fencing_key.pem"


@dataclass(frozen=True)
class FencingKey:
    kid: str
    public_key: Ed25519PublicKey
    private_key: Ed25519PrivateKey | None = None

    def jwk(self) -> dict:
        """The public JWK (RFC 8037), as the key set publishes it."""
        return {"kty": "OKP", "crv": "Ed25519", "x": _public_x(self.public_key),
                "kid": self.kid, "alg": ALGORITHM, "use": "sig"}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _public_x(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _b64url(raw)


def thumbprint(public_key: Ed25519PublicKey) -> str:
    """The key's RFC 7638 JWK thumbprint (SHA-256 over its required members, sorted, no
    whitespace), base64url: the `kid`."""
    members = {"crv": "Ed25519", "kty": "OKP", "x": _public_x(public_key)}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True).encode()
    return _b64url(hashlib.sha256(canonical).digest())


def _load(path: Path, *, must_sign: bool) -> FencingKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImproperlyConfigured(f"JOBQUEUE_FENCING_KEY_FILES: cannot read {path}: {exc}") \
            from exc
    key = None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        if not must_sign:
            try:
                key = serialization.load_pem_public_key(data)
            except (ValueError, TypeError):
                key = None
    if isinstance(key, Ed25519PrivateKey):
        return FencingKey(thumbprint(key.public_key()), key.public_key(), key)
    if isinstance(key, Ed25519PublicKey):
        return FencingKey(thumbprint(key), key)
    wanted = "an unencrypted Ed25519 private key" if must_sign else "an Ed25519 key"
    raise ImproperlyConfigured(
        f"JOBQUEUE_FENCING_KEY_FILES: {path} is not {wanted} in PEM "
        "(make one with: openssl genpkey -algorithm ed25519)"
    )


def generate_key_file(path: Path) -> None:
    """A new Ed25519 private key (PKCS#8 PEM, mode 0600) at `path` unless a key is there
    already. Written whole under another name, then linked into place: a process that sees
    the file sees all of it, and of several processes racing, the first link wins."""
    if path.exists():
        return
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process was first: its key is the one
    finally:
        tmp.unlink(missing_ok=True)


def _key_files() -> tuple[Path, ...]:
    configured = jobqueue_settings().get("FENCING_KEY_FILES") or []
    if configured:
        return tuple(Path(p) for p in configured)
    var_dir = Path(getattr(settings, "VAR_DIR", Path(settings.BASE_DIR) / "var"))
    return (var_dir / GENERATED_KEY_NAME,)


_cache: dict[tuple, tuple[FencingKey, ...]] = {}
_lock = threading.Lock()


def keys() -> tuple[FencingKey, ...]:
    """The configured keys, the signing one first (read once per process and setting)."""
    files = _key_files()
    found = _cache.get(files)
    if found is not None:
        return found
    with _lock:
        found = _cache.get(files)
        if found is None:
            if not jobqueue_settings().get("FENCING_KEY_FILES"):
                generate_key_file(files[0])
            found = tuple(_load(p, must_sign=(i == 0)) for i, p in enumerate(files))
            kids = [k.kid for k in found]
            if len(set(kids)) != len(kids):
                raise ImproperlyConfigured("JOBQUEUE_FENCING_KEY_FILES names one key twice")
            _cache[files] = found
    return found


def signing_key() -> FencingKey:
    return keys()[0]


def issuer() -> str:
    return str(jobqueue_settings().get("FENCING_ISSUER") or "jobqueue")


def jwks() -> dict:
    """The public key set (RFC 7517): every configured key, the signing one first."""
    return {"keys": [key.jwk() for key in keys()]}


def token_for(grant) -> str:
    """The fencing token of a claim (a lifecycle ClaimGrant)."""
    key = signing_key()
    payload = {
        "iss": issuer(),
        "job_id": str(grant.job.id),
        "workspace_id": str(grant.job.workspace_id),
        "attempt": int(grant.attempt),
        "claim_id": str(grant.claim_id),
        "iat": int(grant.claimed_at.timestamp()),
        "exp": int(grant.claim_expires_at.timestamp()),
    }
    return jwt.encode(payload, key.private_key, algorithm=ALGORITHM,
                      headers={"kid": key.kid, "typ": "JWT"})


def check_keys(app_configs=None, **kwargs):
    """System check (`manage.py check`, `migrate`: before a deployment serves): configured key
    files that cannot sign or be published are an error; a generated key that cannot be written
    (unset, the key is made here rather than at the first claim) a warning, which stops no
    command (the maintenance commands need no key). The claim views also load the
    signing key before they claim, so that a bad key never leaves a claim unanswered."""
    from django.core import checks

    try:
        keys()  # unset: generated here, so that a var/ it cannot be written in says so now
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="jobqueue.E001")]
    except OSError as exc:  # a warning: the maintenance commands need no key, claims do
        return [checks.Warning(
            f"cannot write the generated fencing key {_key_files()[0]} ({exc}): every claim "
            "will fail until that directory is writable or JOBQUEUE_FENCING_KEY_FILES is set",
            id="jobqueue.W001")]
    return []
