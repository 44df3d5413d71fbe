"""What `pipeline bench` is asked (BenchConfig, and the `--quick` preset) and what a run
writes (BenchResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core import paths

DEFAULT_MODELS = (
    "digits_lenet",
    "torchvision:resnet18",
    "my_decision_gate",
    "my_cell",
    "my_rnn_loop",
    "wrap_rnn",
    "lstm_tagger",
    "gru_encoder",
)
SERVED_MODELS = ("digits_lenet", "torchvision:resnet18")


@dataclass
class BenchConfig:
    models: tuple[str, ...] = DEFAULT_MODELS
    served_models: tuple[str, ...] = SERVED_MODELS
    batches: tuple[int, ...] = (1, 32)
    threads: int | None = None  # intra-op threads in-process; default: physical cores
    warmup: int = 10
    repeat: int = 30
    rounds: int = 3
    concurrencies: tuple[int, ...] = (1, 8, 32)
    # Keys of served.BATCHING: "old" (the defaults before issue 17) is only there
    # for the throughput target's comparison.
    batching: tuple[str, ...] = ("off", "on", "old")
    # 200 requests a level still give the p99 from two samples above it; the
    # digits CNN's levels end on this count (1-4 s each).
    served_requests: int = 200
    # No new requests after this long at one level: resnet18 answers 8-40 a second
    # here, so its levels end on time, not on count (30-160 requests at 4 s). Three
    # formats × two batching settings × three levels: a third of `make bench`.
    served_level_budget_s: float = 4.0
    cpp: bool = True
    # The runtimes measured serving served_models, each on the same exports, levels and
    # clients (pipeline.serving.runtime); None: every registered runtime.
    runtimes: tuple[str, ...] | None = None
    out_dir: Path | None = None  # default: <artifacts>/bench
    artifacts_root: Path | None = None
    # Per model and batch size, in-process. Only resnet18 reaches it (seven backends
    # at up to 1.5 s a call at batch 32); the small models end on `repeat`.
    time_budget_s: float = 45.0
    # Name each model's fastest verified backend in <out_dir>/fastest.json
    # (merged with the models already there), for `pipeline archive`.
    write_fastest: bool = True
    # ONNX opsets compared with the exported one (18) on the CNNs at batch 1; 20 is
    # the exporter's default, whose AveragePool ran slower here.
    opsets: tuple[int, ...] = (20,)
    # Peers (pipeline.bench.peers): the served models measured beside the yardstick and
    # LitServe on their ONNX file, OIP JSON bodies, concurrency 1 and 8. The issue measured
    # 1,500 requests a level (about 1.5 s for the yardstick at 8; the level budget still
    # ends a slow server's level), twice, the order reversed, the better round kept.
    peer_models: tuple[str, ...] = (SERVED_MODELS[0],)
    peer_requests: int = 1500
    peer_rounds: int = 2
    # Let each runtime first measure its own settings (the KServe runtime: how many worker
    # processes serve each served model best; kserve_workers.json, which `pipeline serve`
    # reads) and measure its rows, and the peers beside it, with what it found.
    tune: bool = True
    footprint: bool = True  # cold start, worker RSS, tracing's cost (bench/footprint.py)
    pt2_sweep: bool = True  # the AOTInductor settings export uses here (bench/pt2settings.py)
    # Export folders by model, where they are not <artifacts>/<model>/export.
    export_dirs: dict[str, Path] = field(default_factory=dict)

    def export_dir(self, model: str) -> Path:
        return Path(self.export_dirs.get(model) or paths.export_dir(model, self.artifacts_root))

    def bench_dir(self) -> Path:
        return Path(self.out_dir or paths.bench_dir(self.artifacts_root))

    @classmethod
    def quick(cls, **kw: Any) -> BenchConfig:
        """About a minute, not a quarter hour: the shape of the output, not its figures. So
        it names no fastest backend for `archive` and `serve` to follow (fastest.json): five
        calls decide nothing (two quick runs here picked int8, then float16)."""
        base = dict(
            models=("digits_lenet",),
            served_models=("digits_lenet",),
            batches=(1,),
            warmup=2,
            repeat=5,
            rounds=2,
            concurrencies=(1, 8),
            batching=("on",),
            served_requests=16,
            peer_requests=16,
            peer_rounds=1,
            cpp=False,
            opsets=(),
            time_budget_s=10.0,
            tune=False,
            footprint=False,
            pt2_sweep=False,
            write_fastest=False,
        )
        return cls(**{**base, **kw})


@dataclass
class BenchResult:
    json_path: Path
    markdown_path: Path
    charts: list[Path]
    data: dict[str, Any] = field(default_factory=dict)
    fastest_path: Path | None = None  # None when the config writes no fastest.json
