"""Loading a large YAML fleet file fast: Python objects straight from libyaml's parse events.

yaml.load with the C loader still builds a node object per scalar and constructs it in Python (about
23 s for a 100,000-host file); building the objects from the parse events, with PyYAML's own
resolver and safe constructors for plain scalars, is several times faster and gives the same
result. Documents with anchors, aliases, explicit tags or merge keys are loaded by yaml.load."""

from __future__ import annotations

from typing import Any, cast

import yaml
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from yaml.nodes import ScalarNode

STR_TAG = "tag:yaml.org,2002:str"
INT_TAG = "tag:yaml.org,2002:int"
# Python refuses to read a decimal integer of over 4300 digits, but not a hex, octal or binary one,
# which then cannot be printed (a ValueError wherever a message shows it): refused as a decimal one is.
MAX_INT_BITS = 14_000  # about 4200 decimal digits


def _int(constructor: Any, node: ScalarNode) -> int:  # a SafeConstructor, or a loader that is one
    value: int = yaml.constructor.SafeConstructor.construct_yaml_int(constructor, node)
    if value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"an integer of over {MAX_INT_BITS * 3 // 10:,} digits")
    return value


class _Constructor(yaml.constructor.SafeConstructor):
    pass


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]  # C or Python, as installed
    pass


for _class in (_Constructor, _Loader):
    _class.add_constructor(INT_TAG, _int)  # on the subclass only: yaml's own loaders are left as they are
LOADER = _Loader


class _Unusual(Exception):
    """The document uses a YAML feature this loader leaves to yaml.load."""


class _Scalars:
    """Plain scalars resolved and constructed exactly as yaml.SafeLoader does (null, bools, numbers,
    timestamps ...); quoted scalars are strings."""

    def __init__(self) -> None:
        self.resolver = yaml.resolver.Resolver()
        self.constructor = _Constructor()
        self.first_chars = self.resolver.yaml_implicit_resolvers
        self.cache: dict[str, Any] = {}

    def value(self, event: ScalarEvent) -> Any:
        if event.tag not in (None, "!"):
            raise _Unusual
        text = event.value
        if not event.implicit[0] or (text and text[0] not in self.first_chars):
            return text
        if text in self.cache:
            return self.cache[text]
        tag = self.resolver.resolve(ScalarNode, text, (True, False))
        if tag == "tag:yaml.org,2002:merge":
            raise _Unusual
        value = (
            text if tag == STR_TAG else self.constructor.yaml_constructors[tag](self.constructor, ScalarNode(tag, text))
        )
        if len(self.cache) < 10_000:
            self.cache[text] = value
        return value


def yaml_load(text: str) -> Any:
    try:
        return _from_events(text)
    except _Unusual:
        return yaml.load(text, Loader=LOADER)


def _from_events(text: str) -> Any:
    scalar = _Scalars().value
    stack: list[Any] = []  # open containers; a mapping's pending key is pushed above it
    documents: list[Any] = []
    for event in yaml.parse(text, Loader=LOADER):
        kind = type(event)
        # The exact-type tests (faster than isinstance here) do not narrow `event` for mypy: cast.
        if kind is ScalarEvent:
            scalar_event = cast(ScalarEvent, event)
            if scalar_event.anchor is not None:
                raise _Unusual
            value = scalar(scalar_event)
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            start = cast(CollectionStartEvent, event)
            if start.anchor is not None or start.tag not in (None, "!"):
                raise _Unusual
            stack.append({} if kind is MappingStartEvent else [])
            continue
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            value = stack.pop()
        elif kind is AliasEvent:
            raise _Unusual
        else:
            continue  # stream and document boundaries
        if not stack:
            documents.append(value)
            continue
        top = stack[-1]
        if type(top) is list:
            top.append(value)
        elif type(top) is _Key:
            stack.pop()
            stack[-1][top.value] = value
        elif type(value) is dict or type(value) is list:
            raise _Unusual  # a complex key
        else:
            stack.append(_Key(value))
    if len(documents) > 1:
        raise _Unusual  # yaml.load says what is wrong with a second document
    return documents[0] if documents else None


class _Key:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value
