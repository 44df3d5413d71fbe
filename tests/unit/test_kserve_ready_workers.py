"""The KServe runtime's workers as loadtest counts them (KServe.worker_pids): the
supervisor's live children that have written their ready marker. A replacement worker
exists seconds before it serves; counted at once, loadtest's recovery after a SIGKILL
read 0.2 s for a worker that took 2.3 s to listen (a user's trial). Real processes: a
stand-in supervisor (its command line names the run's config, as the real one's does)
with two children."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from pipeline.runtimes.kserve import CONFIG_FILE, KServe
from pipeline.runtimes.kserve.supervisor import WORKERS_DIR
from pipeline.serving.server import Server

SUPERVISOR = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(60)
"""


def test_only_workers_that_said_they_serve_are_counted(tmp_path: Path) -> None:
    conf = tmp_path / CONFIG_FILE
    conf.write_text("{}")
    (tmp_path / WORKERS_DIR).mkdir()
    main = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(conf)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        assert main.stdout is not None
        first, second = map(int, main.stdout.readline().split())
        server = Server(runtime="kserve", pid=main.pid, run_dir=str(tmp_path),
                        inference_url="", metrics_url="", models=["m"],
                        markers=[CONFIG_FILE])  # fmt: skip
        workers = KServe().worker_pids
        assert workers(server, "m") == []  # both started, neither serves yet
        (tmp_path / WORKERS_DIR / "0.ready").write_text(str(first))
        assert workers(server, "m") == [first]
        (tmp_path / WORKERS_DIR / "1.ready").write_text(str(second))
        assert workers(server, "m") == sorted([first, second])
        # A dead worker's marker left behind does not count it (its pid is gone).
        psutil.Process(second).kill()
        deadline = time.monotonic() + 10
        while second in workers(server, "m") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers(server, "m") == [first]
    finally:
        for p in psutil.Process(main.pid).children():
            p.kill()
        main.kill()
        main.wait()
