from ninja import NinjaAPI, Swagger

from plugins_app.api import context_engine, context_engine_extra, health, memories, not_found, tokens
from plugins_app.api import permissions as permissions_api
from plugins_app.api import plugins as plugins_api
from plugins_app.api import tools as tools_api
from plugins_app.api.contract import add_components, merge_status_keys
from plugins_app.api.errors import install_handlers
from plugins_app.api.security import route_roles

ROLE_NOTES = {
    "owner": "Role: **owner** (runs or changes plugin code).",
    "admin": "Role: **admin** or owner.",
    "viewer": "Role: **viewer**, admin or owner.",
    "agent": "Role: **agent**, admin or owner.",
}


class Api(NinjaAPI):
    """Adds each operation's required token role (plugins_app.auth.ACTION_ROLES) to its OpenAPI description (and as
    `x-required-role`)."""

    def get_openapi_schema(self, *args, **kwargs):
        schema = super().get_openapi_schema(*args, **kwargs)
        add_components(schema)  # the models routes read or answer by reference (plugins_app/api/contract.py)
        merge_status_keys(schema)
        roles = route_roles(self)
        for methods in schema.get("paths", {}).values():
            for op in methods.values():
                role = roles.get(op.get("operationId", ""))
                if role in ROLE_NOTES:
                    op["x-required-role"] = role
                    op["description"] = (ROLE_NOTES[role] + "\n\n" + op.get("description", "")).strip()
        return schema


api = Api(
    title="LibreFang context-engine plugin platform",
    version="1.0.0",
    description="LibreFang-compatible plugin management and context-engine hook API. "
                "Authenticate with `Authorization: Bearer <token>`.",
    urls_namespace="api",
    openapi_url="/openapi.json",
    docs_url="/docs",
    # served from django-ninja's own static files ("ninja" in INSTALLED_APPS); no request leaves for a validator
    docs=Swagger(settings={"validatorUrl": None}),
)
install_handlers(api)
api.add_router("/", health.router)
api.add_router("/context-engine", context_engine.hooks)
api.add_router("/context-engine", context_engine.router)
api.add_router("/context-engine", context_engine_extra.router)
api.add_router("/plugins", plugins_api.router)
api.add_router("/plugins", permissions_api.router)
api.add_router("/tools", tools_api.router)
api.add_router("/memories", memories.router)
api.add_router("/tokens", tokens.router)
api.add_router("/", not_found.router)  # keep last: JSON 404 for unknown /api/ paths
