"""The notebooks' regression for ``pytest notebooks`` (``scripts/test.sh``): each committed chapter's cells against
the book's own execution of the default run, by nbval's rules (``tests/book_regression.py``). The tiers' own
fixtures and hooks are in ``tests/conftest.py``."""


def pytest_collect_file(file_path, parent):
    if file_path.suffix != ".ipynb":
        return None
    from tests.book_regression import collect_file, wanted

    return collect_file(file_path, parent) if wanted(file_path, parent.config) else None
