"""OpenAPI descriptions of the API's credentials and shared responses (drf-spectacular)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "agents.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Agent token `jqa_...`: acts only as its job agent, on its own jobs.",
        }


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "agents.authentication.ApiKeyAuthentication"
    name = "workspaceApiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "X-API-Key",
            "description": "Workspace API key `jqk_...`: acts for the whole workspace.",
        }


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Stable machine-readable code.")
    detail = serializers.CharField(help_text="Human-readable explanation.")
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Validation errors by field (400 validation_error only).",
    )

    class Meta:
        ref_name = "Error"


_DESCRIPTIONS = {
    400: "validation_error: missing or invalid input (see `fields`)",
    401: "not_authenticated / authentication_failed",
    403: "permission_denied: this credential may not do this",
    404: "not_found: no such object in your scope (also for malformed ids in the path)",
    409: "a lifecycle conflict (see `code`)",
    411: "length_required: a chunked body the server cannot bound",
    413: "payload_too_large",
    415: "unsupported_media_type: send application/json",
    422: "idempotency_key_reused",
    429: "throttled (see Retry-After)",
}

COMMON = (401, 403, 404, 429)
WITH_BODY = (400, 411, 413, 415)


def errors(*codes) -> dict:
    """Response entries for the given HTTP error statuses."""
    return {
        code: OpenApiResponse(ErrorSerializer, description=_DESCRIPTIONS[code])
        for code in sorted(set(codes))
    }


def closed_request_bodies(result, generator, request, public):
    """drf-spectacular postprocessing hook: every request body's component (`<Thing>Request`)
    takes its declared properties and no other (`additionalProperties: false`), as the API
    does (agents.serializers.fields.ApiInput: an unknown field is a 400)."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    return result
