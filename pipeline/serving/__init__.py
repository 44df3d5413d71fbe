"""Serving an export: archives, the TorchServe lifecycle, the gateway, the client and load runs.

archive.py writes the `.mar` files; torchserve.py starts a server over them
(workers.py watches its workers come up) and server.py is its record and
`stop()`; gateway.py is the authenticating front door; client.py is the one
HTTP client every caller uses; parity.py gives verify its served backends;
loadtest.py runs checked load against a served model.
"""
