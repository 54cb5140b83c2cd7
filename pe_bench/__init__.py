"""pe-bench: a multimodal benchmark harness for transformer position encodings."""

__version__ = "0.1.0"
