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
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml here")
    assert issubclass(yamlsource._Loader, yaml.CSafeLoader)
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
