"""The config's YAML is parsed by libyaml where PyYAML has it, with the same data and the
same line marks as the pure-Python parser gives."""

from __future__ import annotations

import pytest
import yaml

from agent.config import yamlsource
from agent.config.yamlsource import line_of, load_yaml

TEXT = """version: 1
node: {name: a, state_dir: /tmp/x}
target:
  ports:
    - {name: lo, id: 1, transport: tcp, address: 127.0.0.1}
  pools:
    - name: p0
      backing: {kind: file, directory: /srv}
      namespaces: {count: 16, size: 4MiB}
    - name: p1
      backing:
        kind: file
        directory: /srv
"""


def test_libyaml_parses_with_the_same_data_and_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """libyaml's parser where PyYAML has it; where it has not (a PyYAML built from source,
    as the floor PyYAML 5.1 is on Python 3.11: scripts/test-floors), the pure-Python one,
    checked the same way."""
    assert issubclass(yamlsource._Loader,
                      yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    fast = load_yaml(TEXT)

    class Pure(yaml.SafeLoader):
        pass

    for tag, fn in yamlsource._Loader.yaml_constructors.items():
        Pure.add_constructor(tag, fn)
    pure = yaml.load(TEXT, Loader=Pure)
    assert fast == pure
    for path in (["target", "pools", 1, "backing", "directory"], ["node", "name"],
                 ["target", "ports", 0]):
        assert line_of(fast, path) == line_of(pure, path)
    assert line_of(fast, ["target", "pools", 1, "backing", "directory"]) == 13


def _lines(data: object) -> object:
    """Every line mark in marked data, in the data's shape."""
    if isinstance(data, dict):
        return (getattr(data, "line", None), getattr(data, "key_lines", None),
                {k: _lines(v) for k, v in data.items()})
    if isinstance(data, list):
        return (getattr(data, "line", None), getattr(data, "item_lines", None),
                [_lines(v) for v in data])
    return None


DOCUMENTS = [
    TEXT,
    "a: &x {b: 1, c: [1, 2.5, true, null, ~, 0x1f, '3', 2026-12-05]}\nd: *x\ne: [*x, *x]\n",
    "base: &b {kind: file, directory: /srv}\nover: {<<: *b, directory: /data}\n",
    "list: &l [a, b]\nnested: {x: *l, y: [*l]}\n",
    "? [complex, key]\n: value\n",
    "!!set {a, b}\n",
    "plain\n",
    "",
]


@pytest.mark.parametrize("text", DOCUMENTS)
def test_the_tree_is_what_the_constructor_makes(text: str) -> None:
    try:
        expected: object = yaml.load(text, Loader=yamlsource._Loader)
    except yaml.YAMLError as exc:
        with pytest.raises(type(exc)):
            load_yaml(text)
        return
    got = load_yaml(text)
    assert got == expected and _lines(got) == _lines(expected)


@pytest.mark.parametrize("text", ["a: &x [*x]\n", "a: &x {b: *x}\n", "a: 1\na: 2\n",
                                  "{[a]: 1}\n", "a: 1\n---\nb: 2\n"])
def test_refused_as_the_constructor_refuses_them(text: str) -> None:
    with pytest.raises(yaml.YAMLError) as by_constructor:
        yaml.load(text, Loader=yamlsource._Loader)
    with pytest.raises(yaml.YAMLError) as here:
        load_yaml(text)
    assert type(here.value) is type(by_constructor.value)
    assert str(here.value) == str(by_constructor.value)


def test_an_alias_is_the_same_object() -> None:
    data = load_yaml("a: &x {b: [1]}\nc: *x\n")
    assert data["a"] is data["c"]
