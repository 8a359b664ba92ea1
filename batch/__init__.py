"""Offline batch inference: files in, Parquet parts and a manifest out (python -m batch), on one machine or on
Ray Data (--ray); `Predictor` is the same work as a Python callable (and a Ray Data map_batches class). It runs
models with the same loading, backends and batching rule as the server. See docs/batch.md."""

from batch.predict import JobError, Predictor

__all__ = ["JobError", "Predictor"]
