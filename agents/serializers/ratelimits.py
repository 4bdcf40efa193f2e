"""Shapes of the rate limits endpoints (agents/views/ratelimits.py): the body of PUT
rate-limits/{key}, a limit as it is read back, and the list's page."""

from __future__ import annotations

from rest_framework import serializers

from jobqueue.lifecycle import inputs

from .fields import ApiInput, StrictIntegerField, page_of


class RateLimitInput(ApiInput):
    count = StrictIntegerField(
        min_value=1, max_value=inputs.MAX_RATE_LIMIT_COUNT,
        help_text="How many of the workspace's jobs with the key may be claimed in any "
        "period_seconds (1 to 100000).")
    period_seconds = StrictIntegerField(
        min_value=1, max_value=inputs.MAX_RATE_LIMIT_PERIOD_SECONDS,
        help_text="The sliding window, in seconds (1 to 86400), on the database's clock.")

    class Meta:
        ref_name = "RateLimitSet"


class RateLimitSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="The rate_limit_key it limits (1 to 255 printable "
                                          "characters).")
    count = serializers.IntegerField(help_text="Claims allowed in any period_seconds.")
    period_seconds = serializers.IntegerField(help_text="The window, in seconds.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField(help_text="When it was last set.")

    class Meta:
        ref_name = "RateLimit"


RateLimitPage = page_of(RateLimitSerializer, "RateLimitPage")
