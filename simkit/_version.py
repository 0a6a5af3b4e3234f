"""simkit's version, in a module of its own so that the servers and the recorder can name
it without importing the ``simkit`` facade (docs/architecture.md, "Layout rules")."""

__version__ = "0.1.0"
