"""The repository carries the license it declares (pyproject.toml, debian/copyright)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: SHA-256 of the Apache License 2.0 as the ASF publishes it
#: (https://www.apache.org/licenses/LICENSE-2.0.txt; Debian's
#: /usr/share/common-licenses/Apache-2.0 is the same file).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_file_is_the_apache_2_0_text_verbatim() -> None:
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256


def test_the_declared_licenses_are_that_file_s() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.findall(r'^license = "(.*)"$', pyproject, re.M) == ["Apache-2.0"]
    # setuptools puts LICEN[CS]E* into the wheel by default (dist-info/licenses/LICENSE);
    # a license-files list would replace that default (and Debian 12's setuptools 66,
    # which builds the .deb, refuses the key): leave it out.
    assert not re.search(r"^license-files\b", pyproject, re.M)
    copyright_ = (REPO / "debian" / "copyright").read_text()
    assert re.findall(r"^License: (\S+)$", copyright_, re.M) == ["Apache-2.0", "Apache-2.0"]
