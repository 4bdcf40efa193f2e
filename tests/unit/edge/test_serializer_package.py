"""agents/serializers/: one module per resource, imported by the package's __init__ (which
vocabulary() counts on: it walks the ApiInput subclasses that exist) and re-exported there;
and the one bound instance per shape that renders and validates (shared_instances)."""

import ast
import gc
import importlib
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from rest_framework import serializers

import agents.serializers as package
from agents.serializers import shared_instances
from agents.serializers.fields import ApiInput, StrictIntegerField
from agents.serializers.shared_instances import represent, validate_input

MODULES = sorted(m.name for m in pkgutil.iter_modules(package.__path__))


def _defined_names(module_name: str) -> set[str]:
    """The public names a module of the package defines (classes, functions, constants)."""
    tree = ast.parse(Path(package.__path__[0], f"{module_name}.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {name for name in names if not name.startswith("_")}


def test_the_package_imports_every_module_it_holds():
    """A module left out of __init__ would be loaded only by its view: vocabulary() could run
    before, and miss its request shapes' words."""
    tree = ast.parse(Path(package.__file__).read_text())
    imported = {node.module for node in tree.body
                if isinstance(node, ast.ImportFrom) and node.level == 1}
    assert imported == set(MODULES)
    assert {"fields", "shared_instances", "jobs", "job_agents"} <= set(MODULES)


def test_the_package_re_exports_every_public_name_of_its_modules():
    expected = {"vocabulary"}
    for module_name in MODULES:
        module = importlib.import_module(f"agents.serializers.{module_name}")
        for name in _defined_names(module_name):
            expected.add(name)
            assert getattr(package, name) is getattr(module, name), name
    assert set(package.__all__) == expected
    assert len(package.__all__) == len(expected)  # no name twice


@pytest.fixture
def shapes():
    """Two shapes of the test's own that count their instances, and empty caches. Made per
    test and collected after: an ApiInput subclass left alive would add its field names to
    vocabulary() for the tests that run after."""

    class Counted(serializers.Serializer):
        built = 0
        name = serializers.CharField()
        size = serializers.IntegerField()

        def __init__(self, *args, **kwargs):
            type(self).built += 1
            super().__init__(*args, **kwargs)

    class CountedInput(ApiInput):
        built = 0
        name = serializers.CharField(max_length=5)
        size = StrictIntegerField(min_value=0, max_value=9)

        def __init__(self, *args, **kwargs):
            type(self).built += 1
            super().__init__(*args, **kwargs)

    saved = shared_instances._RENDERERS.copy(), shared_instances._VALIDATORS.copy()
    shared_instances._RENDERERS.clear()
    shared_instances._VALIDATORS.clear()
    yield SimpleNamespace(Counted=Counted, CountedInput=CountedInput)
    for cache, entries in zip((shared_instances._RENDERERS, shared_instances._VALIDATORS),
                              saved, strict=True):
        cache.clear()
        cache.update(entries)
    del Counted, CountedInput
    gc.collect()


def test_represent_renders_as_the_serializer_would_and_builds_the_shape_once(shapes):
    Counted = shapes.Counted
    rows = [SimpleNamespace(name=f"n{i}", size=i) for i in range(3)]
    assert [represent(Counted, row) for row in rows] == [
        {"name": f"n{i}", "size": i} for i in range(3)]
    assert Counted.built == 1
    assert shared_instances._RENDERERS == {Counted: shared_instances._RENDERERS[Counted]}
    assert [represent(Counted, row) for row in rows] == [dict(Counted(r).data) for r in rows]


def test_validate_input_answers_as_is_valid_would_and_keeps_nothing_between_calls(shapes):
    CountedInput = shapes.CountedInput
    assert validate_input(CountedInput, {"name": "ab", "size": 3}) == {"name": "ab", "size": 3}
    bad = {"name": "abcdefg", "size": "3", "extra": 1}
    with pytest.raises(serializers.ValidationError) as caught:
        validate_input(CountedInput, bad)
    reference = CountedInput(data=bad)
    assert not reference.is_valid()
    assert caught.value.detail == reference.errors
    assert set(caught.value.detail) == {"name", "size", "extra"}
    # The refused body left nothing behind: the next one validates as if it came first.
    assert validate_input(CountedInput, {"name": "cd", "size": 9}) == {"name": "cd", "size": 9}
    assert CountedInput.built == 2  # the shared one, and the reference above
    shared = shared_instances._VALIDATORS[CountedInput]
    assert not hasattr(shared, "_validated_data") and not hasattr(shared, "_errors")
    assert shared_instances._RENDERERS == {}  # a validator is not a renderer
    # A body that is not an object is refused as is_valid() refuses it.
    with pytest.raises(serializers.ValidationError) as caught:
        validate_input(CountedInput, ["not", "an", "object"])
    reference = CountedInput(data=["not", "an", "object"])
    assert not reference.is_valid()
    assert caught.value.detail == reference.errors
