"""JSON documents read back from the state exactly as written, on either database."""

from __future__ import annotations

import math

from sqlalchemy.dialects import postgresql, sqlite

from state.schema import JsonText, dump_json


def test_documents_read_back_as_written_and_an_empty_list_is_a_fresh_one_each_time():
    column = JsonText()
    for dialect in (sqlite.dialect(), postgresql.dialect()):
        for value in ([], [0, 3], {"a": [1.5, None]}, [], {}, None):
            stored = column.process_bind_param(value, dialect)
            assert column.process_result_value(stored, dialect) == value
        back = column.process_result_value(column.process_bind_param(math.inf, dialect), dialect)
        assert back == math.inf
        first = column.process_result_value(dump_json([]), dialect)
        first.append(1)  # a record's list is its own: the next read is still empty
        assert column.process_result_value(dump_json([]), dialect) == []
