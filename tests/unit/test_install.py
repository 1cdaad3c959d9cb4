"""Install: a non-editable ``pip install .`` (what a GPU host or a cluster does) runs ``qkplast run`` end to end.

The wheel carries the notebooks and the thesis tables inside the package (``setup.py``, ``qkplast/shipped.py``);
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


