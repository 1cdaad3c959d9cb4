"""Build step beyond pyproject.toml: a wheel carries the notebooks and the thesis tables inside the package.

``qkplast run`` executes the notebooks, the results chapters read ``data/thesis``, chapter 07 the stored coverage
table (``data/coverage.csv``), chapter 10 the training studies (``studies/``) and
the committed full run (``data/miniature-full/``), and the named corpora
``python-docs`` and ``stdlib-code`` their pinned snapshots (``data/corpora/``); in a checkout all are read where
they are, and a non-editable install (``pip install .``) gets copies under
``qkplast/_shipped/`` (see ``qkplast/resources.py``).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: folder of the checkout -> the files of it a wheel ships
SHIPPED = {"notebooks": ("[0-9][0-9]_*.ipynb", "[0-9][0-9]_*.py"), "data/thesis": ("*.csv", "*.md"),
           "data": ("coverage*.csv",), "data/corpora": ("*.tar.xz", "*.json"),
           "data/miniature-full": ("*.json", "*.csv", "*.log", "*.tar.xz"), "studies": ("*.yaml",)}


class BuildWithShipped(build_py):
    """``build_py`` that also copies :data:`SHIPPED` into ``qkplast/_shipped/`` of the build (not when editable)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for folder, patterns in SHIPPED.items():
            target = Path(self.build_lib) / "qkplast" / "_shipped" / folder
            target.mkdir(parents=True, exist_ok=True)
            for pattern in patterns:
                for path in sorted((ROOT / folder).glob(pattern)):
                    shutil.copy2(path, target / path.name)


setup(cmdclass={"build_py": BuildWithShipped})
