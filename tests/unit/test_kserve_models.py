"""The KServe runtime's request limit (pipeline.runtimes.kserve.models.max_samples):
`PIPELINE_MAX_SAMPLES` sets it for every model of a server, as it does for the TorchServe
handler (pipeline_runtime.handler.max_samples); the runtime ignored it and always took
32 × --max-batch-size."""

from __future__ import annotations

import pytest

from pipeline.core.errors import PipelineError
from pipeline_runtime import oip
from pipeline_runtime.request import MAX_SAMPLES_ENV, SAMPLES_PER_BATCH


@pytest.fixture(scope="module")
def km():
    """The module, imported with pytest's arguments hidden from kserve."""
    return oip.kserve_module("pipeline.runtimes.kserve.models")


def test_without_the_variable_it_is_32_times_the_batch_size(km, monkeypatch) -> None:
    monkeypatch.delenv(MAX_SAMPLES_ENV, raising=False)
    assert km.max_samples(8) == SAMPLES_PER_BATCH * 8
    assert km.max_samples(0) == SAMPLES_PER_BATCH
    monkeypatch.setenv(MAX_SAMPLES_ENV, "")  # empty: unset, as the handler reads it
    assert km.max_samples(2) == SAMPLES_PER_BATCH * 2


def test_the_variable_sets_it_for_every_model(km, monkeypatch) -> None:
    monkeypatch.setenv(MAX_SAMPLES_ENV, "3")
    assert km.max_samples(8) == 3
    monkeypatch.setenv(MAX_SAMPLES_ENV, "1000")
    assert km.max_samples(1) == 1000


@pytest.mark.parametrize("value", ["0", "-4", "2.5", "many"])
def test_a_value_that_is_not_a_count_stops_the_start_saying_so(km, monkeypatch, value) -> None:
    monkeypatch.setenv(MAX_SAMPLES_ENV, value)
    with pytest.raises(PipelineError, match=f"{MAX_SAMPLES_ENV} must be a whole number") as err:
        km.max_samples(8)
    assert repr(value) in str(err.value)


def test_a_served_model_reads_it_before_loading_anything(km, monkeypatch, tmp_path) -> None:
    # The export folder does not exist: the limit is checked first, so a server started
    # with a bad value names the variable, whatever else is wrong.
    config = oip.kserve_module("pipeline.runtimes.kserve.config")
    served = config.ServedExport("m", str(tmp_path / "absent"), "onnx")
    monkeypatch.setenv(MAX_SAMPLES_ENV, "none")
    with pytest.raises(PipelineError, match=MAX_SAMPLES_ENV):
        km.ExportModel(served, config.RuntimeConfig(models=[served]))
