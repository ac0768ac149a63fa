"""The HTTP service, a front door: the FastAPI app and its routers, uploads, metrics, the coverage page.
May import farm.pipeline, workers.backends (a backend's toolchain), registry/ and farm.core;
never farm.cli, infra/ (the dev launcher) or an inference runtime."""
