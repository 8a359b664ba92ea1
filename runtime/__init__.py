"""The inference runtime the server (serving/) and batch jobs (batch/) share: a model directory resolved, checked
and loaded (model_dir.py, artifact.py, loading.py), the backends that run it (backends/), the token-budget
batching rule (batching.py), and the encode -> run -> decode of a task's items (inference.py). It imports bert's
tasks and tokenizer, never serving or batch; torch only inside the torch backend."""
