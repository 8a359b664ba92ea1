"""Quality evaluations: how well a served model answers held-out data, measured through its HTTP endpoints.
Speed lives in bench/; these score answers (accuracy, F1, retrieval recall)."""
