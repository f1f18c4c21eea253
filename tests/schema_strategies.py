"""Hypothesis strategies read off the input formats' own schemas (msgspec types).

`documents(schema)` draws documents the schema describes: every field of every
struct, every bound of every number, every pattern of every string, taken from
`msgspec.inspect` — so a field added to a format is fuzzed without a line here.
`mutated(schema)` draws one of those and breaks it in one place: a value of
the wrong type, a key no schema knows, a required key gone, a number at or
past a bound, text no one types (NUL, a lone surrogate, right-to-left marks,
a megabyte), an integer past Python's 4,300-digit limit.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec.inspect as mi
from hypothesis import strategies as st

#: How many entries a drawn mapping or list has at most (the schemas' own limits are
#: far larger: a fuzzed document stays small, so that each example runs in a moment).
MAX_ENTRIES = 3


#: What a person types: printable characters of any script (the mutations add the rest).
PRINTABLE = st.characters(
    codec="utf-8", exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
)


def documents(schema: Any) -> st.SearchStrategy[Any]:
    """Documents `schema` describes, as decoded JSON or TOML (dicts, lists, scalars)."""
    return _valid(mi.type_info(schema))


def _valid(t: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(t, mi.Metadata):
        return _valid(t.type)
    if isinstance(t, mi.StructType):
        required = {f.encode_name: _valid(f.type) for f in t.fields if f.required}
        optional = {f.encode_name: _valid(f.type) for f in t.fields if not f.required}
        return st.fixed_dictionaries(required, optional=optional)
    if isinstance(t, mi.DictType):
        low = t.min_length or 0
        return st.dictionaries(
            _valid(t.key_type),
            _valid(t.value_type),
            min_size=low,
            max_size=max(low, min(t.max_length or MAX_ENTRIES, MAX_ENTRIES)),
        )
    if isinstance(t, (mi.ListType, mi.VarTupleType)):
        low = t.min_length or 0
        return st.lists(
            _valid(t.item_type),
            min_size=low,
            max_size=max(low, min(t.max_length or MAX_ENTRIES, MAX_ENTRIES)),
        )
    if isinstance(t, mi.TupleType):
        return st.tuples(*(_valid(i) for i in t.item_types)).map(list)
    if isinstance(t, mi.UnionType):
        return st.one_of(*(_valid(member) for member in t.types))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else -(2**63))
        high = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else 2**63 - 1)
        return st.one_of(
            st.sampled_from(sorted({low, high})), st.integers(low, min(high, low + 100))
        )
    if isinstance(t, mi.FloatType):
        low = t.ge if t.ge is not None else t.gt
        high = t.le if t.le is not None else t.lt
        if t.multiple_of == 1:
            whole = st.integers(math.ceil(low), min(math.floor(high), math.ceil(low) + 16))
            return whole.map(float)
        floats = st.floats(
            min_value=low,
            max_value=high,
            exclude_min=t.gt is not None,
            exclude_max=t.lt is not None,
            allow_nan=False,
            allow_infinity=False,
        )
        bounds = [
            b for b, open_ in ((low, t.gt is not None), (high, t.lt is not None)) if not open_
        ]
        small = st.floats(min_value=low, max_value=min(high, (low or 0) + 64), allow_nan=False)
        return st.one_of(floats, small, *([st.sampled_from(bounds)] if bounds else []))
    if isinstance(t, mi.StrType):
        if t.pattern:
            strings = st.from_regex(t.pattern, fullmatch=True, alphabet=PRINTABLE)
        else:
            strings = st.text(PRINTABLE, max_size=min(t.max_length or 16, 16))
        return strings.filter(
            lambda s: len(s) >= (t.min_length or 0) and len(s) <= (t.max_length or math.inf)
        )
    if isinstance(t, mi.AnyType):
        return st.none()
    raise TypeError(f"no strategy for {t!r}")


#: Values that fit no field as they are, or only just: wrong types, bounds, odd text.
ODD_VALUES = st.one_of(
    st.sampled_from(
        [
            True,
            False,
            None,
            0,
            -1,
            -0.0,
            1e308,
            -1e308,
            2**63,
            10**400,  # past any float
            "",
            " ",
            "1",
            "true",
            "\x00",
            "\udcff",  # a lone surrogate
            "\u202e\u200b",  # right-to-left override, zero width space
            "ü" * 3,
            "x" * 1_000_000,  # a megabyte of one line
            [],
            {},
            [1, 2, 3],
            {"unexpected": 1},
        ]
    ),
    st.text(max_size=8),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
)


def mutated(schema: Any) -> st.SearchStrategy[Any]:
    """A document of `schema` broken in one place (which is drawn too)."""
    return documents(schema).flatmap(_mutate)


def _mutate(document: Any) -> st.SearchStrategy[Any]:
    paths = list(_paths(document, ()))
    return st.tuples(
        st.sampled_from(paths),
        st.sampled_from(["replace", "extra key", "drop key", "wrap"]),
        ODD_VALUES,
        st.text(min_size=1, max_size=12),
    ).map(lambda drawn: _apply(document, *drawn))


def _paths(value: Any, at: tuple[Any, ...]):
    yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*at, i))


def _apply(document: Any, path: tuple[Any, ...], how: str, odd: Any, key: str) -> Any:
    import copy

    root = copy.deepcopy(document)
    if not path:
        return odd if how == "replace" else {key: odd} if how == "wrap" else root
    parent = root
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if how == "replace":
        parent[last] = odd
    elif how == "extra key" and isinstance(parent, dict):
        parent[key if key not in parent else key + "_"] = odd
    elif how == "drop key" and isinstance(parent, dict):
        del parent[last]
    elif how == "wrap":
        parent[last] = [parent[last]] if not isinstance(parent[last], list) else {"x": parent[last]}
    else:
        parent[last] = odd
    return root


def toml_document(document: Any) -> str:
    """`document` as TOML, every table inline (quoted keys, escaped strings): a fuzzed
    document of any shape a TOML file can hold. Values TOML cannot hold (None, a lone
    surrogate), or a document that is no table, raise ValueError."""
    if not isinstance(document, dict):
        raise ValueError("a TOML document is a table")
    return "".join(f"{_key(k)} = {_toml(v)}\n" for k, v in document.items())


def _key(key: Any) -> str:
    return _string(str(key))


def _string(text: str) -> str:
    text.encode("utf-8")  # a lone surrogate: not TOML (UnicodeEncodeError is a ValueError)
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if value != value else "inf")
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"TOML has no {type(value).__name__}")
