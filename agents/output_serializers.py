"""Response shapes of the job outputs endpoints (logs; docs/api.md, "Job outputs")."""

from __future__ import annotations

from rest_framework import serializers


class LogAppendSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(help_text="The attempt whose log this is.")
    length = serializers.IntegerField(help_text="The log's length in bytes, after this chunk.")
