"""docs/configuration.md's reference must match the config model (drift test)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agent.config import model
from agent.config.reference import BEGIN, END, render_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_reference_in_docs_matches_model() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text
    current = text[text.index(BEGIN): text.index(END) + len(END)]
    assert current == render_reference(), (
        "docs/configuration.md is out of date; run "
        "`.venv/bin/python -m agent.config.reference docs/configuration.md`"
    )


def test_every_field_is_documented() -> None:
    reference = render_reference()
    for cls in vars(model).values():
        if dataclasses.is_dataclass(cls) and cls.__module__ == model.__name__:
            assert f"### {cls.__name__}" in reference
            for f in dataclasses.fields(cls):
                assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc"
                assert f"| `{f.name}`" in reference
