"""csekit's version (written into saved models); pyproject.toml holds the same number."""

__version__ = "0.1.0"
