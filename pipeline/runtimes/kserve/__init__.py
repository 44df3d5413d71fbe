"""The second runtime: KServe's Python model server speaking the Open Inference
Protocol over the same exports (`pipeline serve --runtime kserve`), and what a
Kubernetes cluster needs to run it (`pipeline deploy kserve`).

`kserve` is imported only inside the runtime's own process: importing it
parses `sys.argv` (kserve 0.21.0), which would break any other command line.
"""
