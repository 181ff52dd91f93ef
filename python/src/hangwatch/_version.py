"""The client's version, sent to the agent in `hello`."""

__version__ = "0.1.0"
