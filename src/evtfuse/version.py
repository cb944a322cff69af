"""evtfuse's version (layer: base; imports nothing): ``evtfuse.__version__``, and part of
the disk cache's key (``runtime.cache``), which must not import the package above it."""

__version__ = "0.1.0"
