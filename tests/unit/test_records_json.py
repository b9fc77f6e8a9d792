"""A binding's JSON is exactly ``dataclasses.asdict`` (written out for speed): the records
file stays the same."""

from __future__ import annotations

from dataclasses import asdict, fields

from hypothesis import given
from hypothesis import strategies as st

from agent.records import Binding, Storage

text = st.text(max_size=12)


@given(st.builds(Binding, text, st.integers(1, 1024), text, text, text, st.none() | text,
                 st.builds(Storage, text, text, text), st.none() | st.integers(0, 1 << 50)))
def test_binding_to_json_is_asdict(binding: Binding) -> None:
    assert binding.to_json() == asdict(binding)
    assert list(binding.to_json()) == [f.name for f in fields(Binding)]  # same key order
    assert Binding.from_json(binding.to_json()) == binding


def test_every_field_is_written() -> None:
    """A field added to Binding or Storage must be added to to_json too."""
    assert [f.name for f in fields(Storage)] == ["kind", "path", "detail"]
    assert len(fields(Binding)) == 8
