"""Shapes of the fairness keys endpoints (agents/views/fairness.py): the body of PUT
fairness-keys/{key}, a key's weight as it is read back, and the list's page."""

from __future__ import annotations

from rest_framework import serializers

from jobqueue.lifecycle import inputs

from .fields import ApiInput, StrictIntegerField, page_of


class FairnessWeightInput(ApiInput):
    weight = StrictIntegerField(
        min_value=1, max_value=inputs.MAX_FAIRNESS_WEIGHT,
        help_text="The key's share of claims against the other keys' weights (1 to 100; a key "
        "without one weighs 1).")

    class Meta:
        ref_name = "FairnessWeightSet"


class FairnessKeySerializer(serializers.Serializer):
    key = serializers.CharField(help_text="The fairness_key it weighs (1 to 255 printable "
                                          "characters).")
    weight = serializers.IntegerField(help_text="Its share of claims, 1 to 100.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField(help_text="When it was last set.")

    class Meta:
        ref_name = "FairnessKey"


FairnessKeyPage = page_of(FairnessKeySerializer, "FairnessKeyPage")
