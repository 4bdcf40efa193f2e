"""Offline verification of a claim's fencing token (docs/effects.md, "Fencing at outside
resources").

Every claim answer carries `claim.fencing_token` (`Claim.fencing_token`): a compact JWS,
EdDSA over Ed25519, with the signing key's `kid` in its header and the payload

    {"iss", "job_id", "workspace_id", "attempt", "claim_id", "iat", "exp"}

An outside resource verifies it with the service's public keys, fetched once
(`fetch_jwks(server)`, GET /v1/.well-known/jwks.json), and then never asks the service again:

    claims = verify_fencing_token(token, jwks, workspace_id="...")
    claims.attempt  # orders the job's claims: refuse one lower than the highest seen

Needs the `fencing` extra (PyJWT and cryptography): pip install 'jobqueue-client[fencing]'.
The base install stays httpx-only; without the extra, verify_fencing_token raises
FencingUnavailable, which says so.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_ISSUER = "jobqueue"
ALGORITHM = "EdDSA"
EXTRA = "pip install 'jobqueue-client[fencing]'"
REQUIRED = ("iss", "job_id", "workspace_id", "attempt", "claim_id", "iat", "exp")


class FencingTokenError(ValueError):
    """A fencing token that does not verify. `reason` is stable, for programs: malformed,
    unknown_key, bad_signature, expired, wrong_issuer, wrong_workspace; the message is for
    people."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class FencingUnavailable(ImportError):
    """The `fencing` extra (PyJWT with cryptography) is not installed."""


@dataclass(frozen=True)
class FencingClaims:
    """A verified token's payload."""

    job_id: str
    workspace_id: str
    attempt: int
    claim_id: str
    issuer: str
    issued_at: dt.datetime
    expires_at: dt.datetime


def fetch_jwks(server: str, *, timeout: float = 10.0,
               transport: httpx.BaseTransport | None = None) -> dict:
    """The service's public key set (GET /v1/.well-known/jwks.json; no credential)."""
    with httpx.Client(timeout=timeout, transport=transport) as http:
        r = http.get(f"{server.rstrip('/')}/v1/.well-known/jwks.json")
        r.raise_for_status()
        return r.json()


def _jwt():
    try:
        import jwt
        from jwt.algorithms import OKPAlgorithm  # noqa: F401 - needs cryptography
    except ImportError as exc:
        raise FencingUnavailable(
            f"verify_fencing_token needs PyJWT with cryptography ({exc}): {EXTRA}"
        ) from exc
    return jwt


@functools.lru_cache(maxsize=64)
def _public_key(jwt, x: str, kid: str):
    """The key object of a JWK (made once per key: a store verifies many tokens)."""
    try:
        return jwt.PyJWK({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid},
                         algorithm=ALGORITHM).key
    except jwt.exceptions.PyJWTError as exc:
        raise FencingTokenError("unknown_key", f"key {kid!r} in the key set is not a "
                                f"usable Ed25519 key: {exc}") from exc


def _key_for(jwt, kid: str, jwks: dict | list):
    keys = jwks.get("keys") if isinstance(jwks, dict) else jwks
    if not isinstance(keys, list):
        raise TypeError('jwks must be a JWK set: {"keys": [...]} (GET /v1/.well-known/jwks.json)')
    for jwk in keys:
        if isinstance(jwk, dict) and jwk.get("kid") == kid:
            if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                raise FencingTokenError("unknown_key", f"key {kid!r} is not an Ed25519 key")
            return _public_key(jwt, str(jwk.get("x")), kid)
    known = ", ".join(repr(k.get("kid")) for k in keys if isinstance(k, dict)) or "none"
    raise FencingTokenError(
        "unknown_key",
        f"fencing token signed by key {kid!r}, which the key set does not hold (it holds "
        f"{known}): signed by another service, or by a newer key (fetch the key set again)",
    )


def verify_fencing_token(token: str, jwks: dict | list, *, workspace_id: str | None = None,
                         issuer: str | None = DEFAULT_ISSUER, check_expiry: bool = True,
                         leeway: float = 0, now: dt.datetime | None = None) -> FencingClaims:
    """Verify `token` offline against `jwks` (the service's key set) and return its claims.

    Checks the signature (EdDSA only, by the key its `kid` names), that every payload member
    is there, `iss` (unless issuer=None), `workspace_id` (when given) and, with check_expiry,
    `exp` (give or take `leeway` seconds; `now` defaults to this machine's clock). A token's
    `exp` is its lease's end at claim time: a heartbeat extends the lease, not the token, so
    a resource a long job writes to late orders writes by `attempt` and may pass
    check_expiry=False (jobqueue_client.fenced_store does).

    Raises FencingTokenError (with a `reason`) when the token does not verify, and
    FencingUnavailable when the `fencing` extra is not installed."""
    jwt = _jwt()
    if not isinstance(token, str) or token.count(".") != 2:
        raise FencingTokenError("malformed", "malformed fencing token: not a compact JWS "
                                "(three base64url parts separated by dots)")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.exceptions.DecodeError as exc:
        raise FencingTokenError("malformed", f"malformed fencing token: {exc}") from exc
    if header.get("alg") != ALGORITHM:
        raise FencingTokenError("malformed", f"fencing token algorithm {header.get('alg')!r}: "
                                f"only {ALGORITHM} is accepted")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise FencingTokenError("malformed", "malformed fencing token: no kid in its header")
    key = _key_for(jwt, kid, jwks)
    try:
        payload = jwt.decode(token, key, algorithms=[ALGORITHM],
                             options={"verify_exp": False, "verify_iat": False,
                                      "verify_nbf": False, "verify_aud": False,
                                      "verify_iss": False})
    except jwt.exceptions.InvalidSignatureError as exc:
        raise FencingTokenError("bad_signature", "fencing token signature does not verify "
                                f"with key {kid!r}: forged or altered") from exc
    except jwt.exceptions.InvalidTokenError as exc:
        raise FencingTokenError("malformed", f"malformed fencing token: {exc}") from exc
    return _check(payload, workspace_id=workspace_id, issuer=issuer,
                  check_expiry=check_expiry, leeway=leeway, now=now)


def _check(payload: Any, *, workspace_id, issuer, check_expiry, leeway, now) -> FencingClaims:
    # PyJWT decodes only an object (else its DecodeError: malformed, above).
    if not isinstance(payload, dict):  # pragma: no cover -- a guard (above)
        raise FencingTokenError("malformed", "malformed fencing token: payload not an object")
    missing = [name for name in REQUIRED if name not in payload]
    if missing:
        raise FencingTokenError("malformed", "malformed fencing token: no "
                                + ", ".join(missing) + " in its payload")
    try:
        attempt, iat, exp = int(payload["attempt"]), float(payload["iat"]), float(payload["exp"])
        if isinstance(payload["attempt"], bool) or attempt != payload["attempt"]:
            raise ValueError("attempt")
        # A time no datetime holds (1e300, 1e999 read as inf, NaN) is no time the service
        # writes: malformed, not an OverflowError from the conversion.
        issued_at = dt.datetime.fromtimestamp(iat, dt.UTC)
        expires_at = dt.datetime.fromtimestamp(exp, dt.UTC)
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        raise FencingTokenError("malformed", "malformed fencing token: attempt, iat and exp "
                                "must be numbers (attempt an integer, iat and exp times a "
                                "datetime can hold)") from exc
    if issuer is not None and payload["iss"] != issuer:
        raise FencingTokenError("wrong_issuer", f"fencing token issued by {payload['iss']!r}, "
                                f"not {issuer!r}")
    if workspace_id is not None and str(payload["workspace_id"]) != str(workspace_id):
        raise FencingTokenError("wrong_workspace", "fencing token is for workspace "
                                f"{payload['workspace_id']!r}, not {str(workspace_id)!r}")
    if check_expiry:
        current = now or dt.datetime.now(dt.UTC)
        if current.timestamp() >= exp + leeway:
            raise FencingTokenError("expired", "fencing token expired at "
                                    f"{expires_at.isoformat()} (its lease's end at claim time)")
    return FencingClaims(
        job_id=str(payload["job_id"]), workspace_id=str(payload["workspace_id"]),
        attempt=attempt, claim_id=str(payload["claim_id"]), issuer=str(payload["iss"]),
        issued_at=issued_at, expires_at=expires_at,
    )

