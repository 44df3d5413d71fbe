KSERVE = "kserve"
def f(server, rt):
    if server.runtime == "kserve": pass
    if rt in ("torchserve", "x"): pass
    if server.runtime != wire.KSERVE: pass
    match rt:
        case "torchserve": pass
