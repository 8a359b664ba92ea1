"""Training data: readers for labelled datasets and the pretraining pipeline (corpus -> shards -> masked batches)."""
