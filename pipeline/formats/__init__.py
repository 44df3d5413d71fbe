"""The format registry: one module per exported format, each registered once (see base.py)."""
