"""tests/cpu_profile.py: the suite's CPU by kind of process, sampled from /proc."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests import cli_fork, cpu_profile

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


@pytest.mark.parametrize(
    ("command", "name", "kind"),
    [
        (f"/v/bin/python -c {cli_fork._SOURCE[:300]}", "python", "pipeline commands, forked"),
        ("/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "python", "pytest workers"),
        ("/v/bin/python -m pipeline.runtimes.kserve.runtime /tmp/run/kserve.json", "python", "KServe"),
        ("/v/bin/python /v/lib/site-packages/ts/model_service_worker.py --sock-type unix", "python",
         "TorchServe Python workers"),
        ("/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -quiet -I /root/include", "cc1plus", "C++ compilers"),
        ("java -Dmodel_server_home=/v/lib -cp .:/v/ts/frontend/*", "java", "TorchServe JVMs"),
        ("/v/bin/python /v/lib/python3.11/site-packages/ray/_private/workers/default_worker.py",
         "ray::ServeRepli", "Ray"),
        ("/v/bin/python -m pipeline verify --export-dir /tmp/x", "python", "pipeline commands (plain"),
        ("/v/bin/python .venv/bin/pipeline train --model digits_lenet", "pipeline", "pipeline commands (plain"),
        ("/v/bin/python -u -m pipeline --artifacts-dir /t/ddp train --model digits_mlp", "python",
         "DDP training ranks"),
        ("/v/bin/python -m pipeline.runtimes.torchserve.gateway /t/gateway.json", "python",
         "TorchServe gateways"),
        ("/r/cpp_client/build/run_torchscript --model m.pt", "run_torchscript", "C++ clients"),
        ("", "kworker/1:1H", "other (kworker/1:1H)"),
    ],
)  # fmt: skip
def test_each_process_is_sorted_into_its_kind(command: str, name: str, kind: str) -> None:
    assert cpu_profile.kind_of(command, name).startswith(kind)


def test_a_child_that_burns_cpu_is_counted_and_the_machine_total_covers_it() -> None:
    sampler = cpu_profile.Sampler()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
    # sleeps first so that the sampler reads its command line after exec
    subprocess.run([sys.executable, "-c", "import time; time.sleep(0.6)\n" + burn], check=True)
    time.sleep(2 * cpu_profile.SAMPLE_S)
    found = sampler.finish()
    other = {k["kind"]: k for k in found["kinds"]}["other Python"]
    assert other["processes"] >= 1 and other["cpu_s"] >= 0.4, found["kinds"]
    assert found["busy_cpu_s"] >= 0.4 and found["wall_s"] > 1.0
    # Its command line as a user reads it (arguments apart, not NUL-joined), so that the
    # kinds' patterns ("-m pipeline", "-m pytest") can match.
    (command,) = [c for _, _, c in found["costliest"] if "process_time" in c]
    assert command.startswith(f"{sys.executable} -c import time; time.sleep(0.6) import time"), (
        command
    )
