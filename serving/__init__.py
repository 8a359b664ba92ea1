"""The HTTP server (`python -m serving`): settings, the FastAPI app factory, the routes (generated from the task
registry), middleware (request ids, auth, admission), errors and Prometheus metrics, around the models the
inference runtime loads, batches and runs. It never imports batch/, export/ or training/. See docs/serving.md.
"""
