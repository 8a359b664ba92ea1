"""Liveness, `GET /health`: one answer, whichever server holds the port. While the model loads, the responder
in serving/startup.py answers it; once the app runs, its route (serving/routes/api.py) does. 200 with ALIVE
while the process is up (an orchestrator must not restart a replica for loading slowly); 503 only once the
model has failed to start. Imports nothing, so the responder that holds the port starts at once."""

HEALTH_PATH = "/health"
ALIVE = {"status": "ok"}


def is_health(path: str) -> bool:
    """Whether a request target (with or without a query string) asks for liveness."""
    return path.split("?", 1)[0] == HEALTH_PATH
