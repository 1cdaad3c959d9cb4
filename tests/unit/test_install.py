"""Install: a non-editable ``pip install .`` (what a GPU host or a cluster does) runs ``qkplast run`` end to end.

The wheel carries the notebooks and the thesis tables inside the package (``setup.py``, ``qkplast/resources.py``);
the run below imports only the installed copy (run from outside the checkout, with the install first on the path).
"""

from __future__ import annotations

import re

from tests.helpers import ROOT



def test_torch_is_a_range_and_the_cpu_pin_lives_in_setup():
    pyproject = (ROOT / "pyproject.toml").read_text()
    torch = re.findall(r'"torch([^"]*)"', pyproject)
    assert torch and not torch[0].startswith("=="), f"pyproject.toml pins torch exactly: {torch}"
    assert 'pip install -q "torch==2.13.0"' in (ROOT / "scripts" / "setup.sh").read_text()




def test_the_license_is_an_spdx_expression_the_build_backend_accepts():
    import tomllib

    from packaging.licenses import canonicalize_license_expression
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    license = pyproject["project"]["license"]
    # a TOML table ({text = ...}) is deprecated by setuptools (dropped from 2027-02-18) and warns on every install
    assert isinstance(license, str), f"project.license is {license!r}, not an SPDX expression string"
    assert canonicalize_license_expression(license) == license, f"{license!r} is not a canonical SPDX expression"
    setuptools = next(Requirement(r) for r in pyproject["build-system"]["requires"] if r.startswith("setuptools"))
    assert "77" in setuptools.specifier and "76.9" not in setuptools.specifier, (
        f"build-system requires {setuptools}: setuptools reads an SPDX license string from 77 on")
