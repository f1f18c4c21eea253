"""The input formats' schemas: published as they are, and bounded everywhere."""

from __future__ import annotations

import msgspec.inspect as mi
import pytest

from app.config import ClusterConfigFile
from app.files import Trace
from app.jobfile import EvaJobConfig, JobFile
from app.schemas import FORMATS, SCHEMA_DIR, rendered
from app.state_config import StateTable
from provisioners.catalog import CatalogCacheFile, EvaCatalogFile, PriceTableFile

EVERY_SCHEMA = [
    ClusterConfigFile,
    StateTable,
    JobFile,
    EvaJobConfig,
    Trace,
    EvaCatalogFile,
    CatalogCacheFile,
    PriceTableFile,
]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_published_json_schema_is_the_one_the_commands_read_with(name):
    published = SCHEMA_DIR / f"{name}.schema.json"
    assert published.read_text(encoding="utf-8") == rendered(name), (
        f"{published} is out of date: run `python -m app.schemas`"
    )


def leaves(t: mi.Type, path: str = "$"):
    """Every scalar type in `t`, with where it is."""
    if isinstance(t, mi.Metadata):
        yield from leaves(t.type, path)
    elif isinstance(t, mi.StructType):
        for f in t.fields:
            yield from leaves(f.type, f"{path}.{f.encode_name}")
    elif isinstance(t, mi.DictType):
        yield from leaves(t.key_type, f"{path}{{key}}")
        yield from leaves(t.value_type, f"{path}{{value}}")
    elif isinstance(t, (mi.ListType, mi.VarTupleType)):
        yield from leaves(t.item_type, f"{path}[]")
    elif isinstance(t, mi.TupleType):
        for i, item in enumerate(t.item_types):
            yield from leaves(item, f"{path}[{i}]")
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield from leaves(member, path)
    else:
        yield path, t


@pytest.mark.parametrize("schema", EVERY_SCHEMA, ids=lambda s: getattr(s, "__name__", "Trace"))
def test_every_number_and_string_of_every_format_is_bounded(schema):
    """Nothing read without a bound: no float without both bounds (1e400 is inf, inf
    passes a one-sided bound), no integer or string of unbounded size."""
    for path, t in leaves(mi.type_info(schema)):
        if isinstance(t, mi.FloatType):
            assert t.ge is not None or t.gt is not None, path
            assert t.le is not None or t.lt is not None, path
        elif isinstance(t, mi.IntType):
            assert (t.ge is not None or t.gt is not None) and t.le is not None, path
        elif isinstance(t, mi.StrType):
            assert t.max_length is not None, path
        else:
            assert isinstance(t, (mi.BoolType, mi.NoneType, mi.LiteralType)), (path, t)


def test_a_published_bound_does_not_depend_on_which_module_was_imported_first():
    # `typing` caches Annotated[float, Meta(ge=7)] and Annotated[float, Meta(ge=7.0)] as one
    # type: whichever a module builds first is what every other module gets.
    from typing import Annotated

    import msgspec

    from provisioners.documents import number

    first = Annotated[float, number(ge=7, le=9)]
    second = Annotated[float, number(ge=7.0, le=9.0)]
    for schema in (msgspec.json.schema(first), msgspec.json.schema(second)):
        assert repr(schema["minimum"]) == "7.0" and repr(schema["maximum"]) == "9.0"
