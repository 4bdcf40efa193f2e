"""GET /v1/version: which server this is, for anyone (no credential needed; one sent is not
looked at). The same version is in /healthz and in the schema's info.version.

GET /v1/.well-known/jwks.json: the public keys that verify fencing tokens, for anyone too."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

import jobqueue
from jobqueue import fencing
from jobqueue.conf import jobqueue_settings


class VersionSerializer(serializers.Serializer):
    server = serializers.CharField(help_text='Always "jobqueue".')
    version = serializers.CharField(help_text="The server's version (CHANGELOG.md), e.g. 0.3.0.")
    api = serializers.CharField(help_text='The API\'s major version, "v1" (its path prefix).')
    min_client_version = serializers.CharField(
        help_text="The oldest jobqueue-client (major.minor) this server supports "
                  "(JOBQUEUE_MIN_CLIENT_VERSION); older ones are logged."
    )

    class Meta:
        ref_name = "Version"


class VersionView(APIView):
    # Public, like /healthz: it tells a client what it talks to before it has credentials.
    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes: list = []

    @extend_schema(
        tags=["meta"],
        operation_id="get_version",
        summary="The server's version and the oldest client it supports (no credential)",
        auth=[],
        responses={200: VersionSerializer},
    )
    def get(self, request):
        return Response({
            "server": "jobqueue",
            "version": jobqueue.__version__,
            "api": "v1",
            "min_client_version": str(jobqueue_settings()["MIN_CLIENT_VERSION"]),
        })


class JwkSerializer(serializers.Serializer):
    kty = serializers.CharField(help_text='"OKP".')
    crv = serializers.CharField(help_text='"Ed25519".')
    x = serializers.CharField(help_text="The public key, base64url.")
    kid = serializers.CharField(help_text="The key's RFC 7638 thumbprint: a token's header "
                                "`kid` names it.")
    alg = serializers.CharField(help_text='"EdDSA".')
    use = serializers.CharField(help_text='"sig".')

    class Meta:
        ref_name = "Jwk"


class JwksSerializer(serializers.Serializer):
    keys = JwkSerializer(many=True, help_text="The signing key first, then keys kept only "
                         "so that tokens they signed still verify.")

    class Meta:
        ref_name = "Jwks"


class JwksView(APIView):
    """The public keys that verify claims' fencing tokens. Public and cacheable: an outside
    resource fetches it once (and again on a `kid` it does not know)."""

    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes: list = []

    @extend_schema(
        tags=["meta"],
        operation_id="get_jwks",
        summary="The public keys (JWKS) that verify fencing tokens (no credential)",
        auth=[],
        responses={200: JwksSerializer},
    )
    def get(self, request):
        response = Response(fencing.jwks())
        max_age = int(jobqueue_settings()["JWKS_MAX_AGE_SECONDS"])
        response["Cache-Control"] = f"public, max-age={max_age}"
        return response
