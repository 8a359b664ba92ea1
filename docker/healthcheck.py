"""Container HEALTHCHECK: exit 0 when GET /health answers 2xx. Python's stdlib only, no curl."""
import os
import sys
import urllib.request

port = os.environ.get("BERTSERVE_PORT", "8000")
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=4) as response:
        sys.exit(0 if 200 <= response.status < 300 else 1)
except Exception as error:  # noqa: BLE001 - any failure is "unhealthy"
    print(f"healthcheck: {error}", file=sys.stderr)
    sys.exit(1)
