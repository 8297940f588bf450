from ninja import NinjaAPI

from plugins_app.api import context_engine, fallback, health
from plugins_app.api import plugins as plugins_api
from plugins_app.api import tools as tools_api
from plugins_app.api.errors import install_handlers

api = NinjaAPI(
    title="LibreFang context-engine plugin platform",
    version="1.0.0",
    description="LibreFang-compatible plugin management and context-engine hook API. "
                "Authenticate with `Authorization: Bearer <token>`.",
    urls_namespace="api",
    openapi_url="/openapi.json",
    docs_url="/docs",
)
install_handlers(api)
api.add_router("/", health.router)
api.add_router("/context-engine", context_engine.router)
api.add_router("/plugins", plugins_api.router)
api.add_router("/tools", tools_api.router)
api.add_router("/", fallback.router)  # keep last: JSON 404 for unknown /api/ paths
