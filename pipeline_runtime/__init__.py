"""The serving runtime: what the TorchServe handlers (and every .mar) carry.

Imports torch, numpy and onnxruntime only, never `pipeline`: it runs inside a
TorchServe worker from the archive.
"""
