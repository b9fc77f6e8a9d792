"""Docs in step with the code: the troubleshooting table covers every errno kvagent types."""

from __future__ import annotations

import errno
from pathlib import Path

from nvmet.errors import _BY_ERRNO

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_troubleshooting_table_covers_every_typed_errno() -> None:
    text = (DOCS / "operations.md").read_text()
    table = text[text.index("## Troubleshooting"):]
    typed = {errno.errorcode[e] for e in _BY_ERRNO} - {"ERANGE", "EFAULT", "ENXIO", "ENOTDIR",
                                                       "EISDIR"}
    missing = sorted(name for name in typed if name not in table)
    assert not missing, f"docs/operations.md troubleshooting lacks {missing}"


def test_readme_links_resolve() -> None:
    import re

    root = DOCS.parent
    for doc in [root / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
