"""Response shapes of the job outputs endpoints (agents/views/outputs.py: the log and the
artifacts of a job; docs/api.md, "Job outputs"). Their request bodies are raw bytes, never
parsed as JSON, so there is no ApiInput here."""

from __future__ import annotations

from rest_framework import serializers


class LogAppendSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(help_text="The attempt whose log this is.")
    length = serializers.IntegerField(help_text="The log's length in bytes, after this chunk.")


class ArtifactSerializer(serializers.Serializer):
    name = serializers.CharField()
    size = serializers.IntegerField(help_text="Bytes.")
    sha256 = serializers.CharField(help_text="Hex SHA-256 of the bytes (the download's ETag).")
    attempt = serializers.IntegerField(help_text="The attempt that uploaded it.")
    content_type = serializers.CharField(
        help_text="As uploaded; metadata only (downloads are application/octet-stream).")


class ArtifactListSerializer(serializers.Serializer):
    results = ArtifactSerializer(many=True)
