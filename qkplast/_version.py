"""The package version, in a module of its own so that no module imports it from the package ``__init__``."""

__version__ = "0.1.0"


def package_versions(names=("qkplast", "transformers", "torch")) -> dict[str, str | None]:
    """Installed versions of ``names`` (None for a package that is not installed), as plain strings.

    The capture attrs record the default three; a run's manifest records more.
    """
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
