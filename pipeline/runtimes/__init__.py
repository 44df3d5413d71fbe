"""The serving runtimes: one package each, registered with pipeline.serving.runtime."""
