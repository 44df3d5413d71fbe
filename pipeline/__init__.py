"""Train, export and verify PyTorch models across deployment backends."""

__version__ = "0.1.0"
