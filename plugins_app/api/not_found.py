"""Unknown paths under /api/ get the JSON error envelope (not Django's HTML 404 page). Registered last."""

from ninja import Router

from plugins_app.api.errors import ApiError

router = Router()


@router.api_operation(["GET", "POST", "PUT", "PATCH", "DELETE"], "/{path:rest}", auth=None, include_in_schema=False)
def not_found(request, rest: str):
    raise ApiError(404, "not_found", f"no API route {request.path!r}; see /api/openapi.json")
