"""The service's routes, one FastAPI ``APIRouter`` per resource; ``farm.api.app`` includes them.
Each module reaches the settings, registry and token checks through ``farm.api.deps``."""
