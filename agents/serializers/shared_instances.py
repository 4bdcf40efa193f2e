"""One bound serializer instance per shape, reused by every request: represent() renders an
output shape with it, validate_input() validates a request body with it.

Why reuse instances: a DRF serializer deep-copies all its declared fields whenever it is
instantiated. For the claimed job that was about a third of a claim request's Python time,
and about 0.3 ms of a status report's body (docs/performance.md, "HTTP"). Building each
shape once, its fields bound, and keeping it for the life of the process saves that on every
request.

Why it is safe: to_representation keeps no per-call state in the serializer or its fields,
and run_validation stores nothing on them either (unlike is_valid(), which stores
`validated_data` and `errors` on the instance). So one instance can serve every request, on
every thread of a gthread worker at once. The shapes that go through here need no context:
a shape that reads `self.context` (JobDetailSerializer, ClaimStateSerializer) is built per
request, as DRF does.

The two caches are separate only because they serve separate calls; a shape built twice by
two threads racing on first use is harmless (both instances are equal, one is kept).
"""

from __future__ import annotations

from rest_framework import serializers

# serializer class -> its one bound instance, for represent() (output shapes)
_RENDERERS: dict = {}
# serializer class -> its one bound instance, for validate_input() (request bodies)
_VALIDATORS: dict = {}


def _bound_instance(instances: dict, serializer_class):
    """The one instance of `serializer_class` in `instances`, its fields bound (built and
    kept on first use)."""
    instance = instances.get(serializer_class)
    if instance is None:
        instance = serializer_class()
        instance.fields  # noqa: B018 - bind the fields once
        instances[serializer_class] = instance
    return instance


def represent(serializer_class, obj) -> dict:
    """`serializer_class(obj).data`, rendered by the shape's one bound instance (no context:
    the shape must not read `self.context`)."""
    return _bound_instance(_RENDERERS, serializer_class).to_representation(obj)


def validate_input(serializer_class, data) -> dict:
    """`serializer_class(data=data)`'s validated data, or its ValidationError, as is_valid()
    gives them, from the shape's one bound instance (no context, and nothing stored on it:
    run_validation, not is_valid())."""
    try:
        return _bound_instance(_VALIDATORS, serializer_class).run_validation(data)
    except serializers.ValidationError as exc:
        raise serializers.ValidationError(serializers.as_serializer_error(exc)) from None
