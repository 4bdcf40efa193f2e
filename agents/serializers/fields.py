"""The building blocks of the API's shapes: field types that take JSON's own types only (DRF's
own would also take "5" for 5, or 1 for true), ApiInput (a request body of its declared
fields and no other), the bodies several resources take (EmptyInput, ReasonInput), and
page_of (a list's page, for the schema)."""

from __future__ import annotations

from collections.abc import Mapping

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from jobqueue.exceptions import InvalidInput

INT32_MAX = 2**31 - 1


class StrictUUIDField(serializers.UUIDField):
    """A UUID given as a string (DRF's field would also take an integer)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid", value="")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: DRF's field would also take "5", 5.0 and true. The error names the
    bounds. `rule`, a validator of jobqueue.lifecycle.inputs, checks the bounds that come
    from settings (`limit`, `lease_seconds`, ...) here already, with the lifecycle's message;
    `min_value` and `max_value` are then the outer bounds the schema publishes."""

    def __init__(self, *, rule=None, **kwargs):
        low, high = kwargs.get("min_value"), kwargs.get("max_value")
        messages = {"invalid": "Must be a JSON integer (not a string, a fraction or a boolean)."}
        if low is not None and high is not None:
            messages["min_value"] = messages["max_value"] = (
                f"Must be an integer from {low} to {high}.")
        kwargs["error_messages"] = {**messages, **kwargs.get("error_messages", {})}
        super().__init__(**kwargs)
        self.rule = rule

    def to_internal_value(self, data):
        if not isinstance(data, int) or isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if self.rule is not None:
            try:
                self.rule(value)
            except InvalidInput as exc:
                raise serializers.ValidationError(exc.detail, code="invalid") from None
        return value


class StrictCharField(serializers.CharField):
    """Text given as a string (DRF's field would also take a number)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class LabelField(serializers.RegexField):
    """One label (docs/api.md, "Labels"): 1 to 63 characters of [A-Za-z0-9._:=/-]."""

    def __init__(self, **kwargs):
        super().__init__(r"^[A-Za-z0-9._:=/-]{1,63}$", max_length=63, min_length=1,
                         error_messages={"invalid": "Must be 1 to 63 characters of A-Z a-z "
                                                    "0-9 . _ : = / -."}, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


def labels_field(most: int, **kwargs) -> serializers.ListField:
    """A label set in a body: a list of at most `most` labels (repeats count once)."""
    return serializers.ListField(child=LabelField(), max_length=most, **kwargs)


class StrictBooleanField(serializers.BooleanField):
    """true or false, as JSON booleans only (DRF's field also takes "yes", 1, "on"...)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input="")
        return data


class StrictChoiceField(serializers.ChoiceField):
    """A choice whose error names the allowed values, never the value sent (DRF's own
    message quotes it: '"<what you sent>" is not a valid choice.')."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        allowed = ", ".join(str(choice) for choice in self.choices)
        self.error_messages["invalid_choice"] = f"Must be one of: {allowed}."


MAX_UNKNOWN_NAMED = 20


class ApiInput(serializers.Serializer):
    """A request body: a JSON object of the declared fields and no other. A field it does not
    declare is a 400 naming it (a misspelt optional field would otherwise change nothing, and
    nobody would notice), together with the body's other errors."""

    def to_internal_value(self, data):
        unknown = ([key for key in data if key not in self.fields]
                   if isinstance(data, Mapping) else [])
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if not unknown or not isinstance(exc.detail, dict):
                raise
            raise serializers.ValidationError({**exc.detail, **self._unknown(unknown)}) from None
        if unknown:
            raise serializers.ValidationError(self._unknown(unknown))
        return value

    def _unknown(self, names: list) -> dict:
        """{name: [message]} for the unknown fields. A name is the one part of a body an error
        quotes, on purpose: up to 20 of them, each if it is 1 to 100 printable characters."""
        message = "Unknown field; this body takes " + ", ".join(sorted(self.fields)) + "."
        shown = [n for n in names if 0 < len(n) <= 100 and n.isprintable()][:MAX_UNKNOWN_NAMED]
        errors = {name: [message] for name in shown}
        if len(shown) < len(names):
            errors["non_field_errors"] = [
                f"{len(names) - len(shown)} more unknown fields (names over 100 characters or "
                f"not printable are not shown, nor more than {MAX_UNKNOWN_NAMED})."]
        return errors


# --- bodies several resources take --------------------------------------------------------


class EmptyInput(ApiInput):
    """The body of an endpoint that takes none: absent or `{}` (any field is unknown)."""

    class Meta:
        ref_name = "Empty"


class ReasonInput(ApiInput):
    reason = StrictCharField(required=False, allow_blank=True, max_length=500)

    class Meta:
        ref_name = "Reason"


# --- pages --------------------------------------------------------------------------------


def page_of(item_serializer, name: str):
    """A {"results", "next", "previous"} page serializer for the schema. One page, not a
    list of pages: `many=False` tells drf-spectacular so in the viewsets' list actions."""
    return extend_schema_serializer(many=False)(type(
        name,
        (serializers.Serializer,),
        {
            "results": item_serializer(many=True),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "Meta": type("Meta", (), {"ref_name": name}),
        },
    ))
