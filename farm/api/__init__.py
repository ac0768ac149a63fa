"""The HTTP service (a front door): FastAPI app, uploads, metrics, the coverage page."""
