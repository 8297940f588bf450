"""One JSON error envelope for every failure: {"error": {"code", "message", "details"?}}."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from pydantic import ValidationError as PydanticValidationError

from engine.errors import ServiceError, validation_details
from plugins_app.bus import to_json


class ApiError(ServiceError):
    """A refusal raised by a route itself (status first, as routes read best)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None):
        super().__init__(code, message, status, details)


def json_response(data: Any, status: int = 200) -> HttpResponse:
    """A JSON response that is not filtered through the response schema (hook results carry open-ended fields),
    encoded as every answer to an agent is (plugins_app/bus/job.py to_json)."""

    return HttpResponse(to_json(data), status=status, content_type="application/json")


def envelope(code: str, message: str, details: Any = None) -> dict:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return {"error": body}


def _json_not_allowed(self) -> HttpResponse:
    """405 in the error envelope (django-ninja answers plain text), with the Allow header."""

    allowed = sorted({m for op in self.operations for m in op.methods})
    resp = HttpResponse(json.dumps(envelope("method_not_allowed", f"allowed methods: {', '.join(allowed)}")),
                        status=405, content_type="application/json")
    resp["Allow"] = ", ".join(allowed)
    return resp


def install_handlers(api: NinjaAPI) -> None:
    from ninja.operation import PathView

    PathView._not_allowed = _json_not_allowed  # the only NinjaAPI in this process is ours
    def respond(request: HttpRequest, status: int, code: str, message: str, details: Any = None) -> HttpResponse:
        return api.create_response(request, envelope(code, message, details), status=status)

    @api.exception_handler(ServiceError)
    def _service_error(request, exc: ServiceError):
        # ApiError from routes; PluginError, InstallError, ToolError from the services and engine they call
        return respond(request, exc.status, exc.code, exc.message, exc.details)

    @api.exception_handler(ValidationError)
    def _validation(request, exc: ValidationError):
        errors = validation_details(exc.errors)
        if any(e["type"] == "json_invalid" for e in errors):
            return respond(request, 400, "invalid_json", "The request body is not valid JSON.", errors)
        return respond(request, 400, "validation_error", "The request does not match the expected shape.", errors)

    @api.exception_handler(AuthenticationError)
    def _unauth(request, exc):
        return respond(request, 401, "unauthorized", "A valid bearer token is required (Authorization: Bearer …).")

    @api.exception_handler(HttpError)
    def _http(request, exc: HttpError):
        if exc.status_code == 400 and "parse request body" in str(exc):
            return respond(request, 400, "invalid_json", f"The request body is not valid JSON: {exc}")
        return respond(request, exc.status_code, _code_for(exc.status_code), str(exc))

    @api.exception_handler(RequestDataTooBig)
    def _too_big(request, exc):
        from django.conf import settings

        return respond(request, 413, "payload_too_large",
                       f"request body exceeds {settings.LIBREFANG_MAX_BODY_BYTES} bytes")

    @api.exception_handler(Exception)
    def _unexpected(request, exc: Exception):
        import logging

        logging.getLogger("librefang.api").exception("unhandled API error")
        return respond(request, 500, "internal_error", "Unexpected server error; see the service log.")


def _code_for(status: int) -> str:
    return {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
            409: "conflict", 413: "payload_too_large", 422: "unprocessable", 429: "too_many_requests"}.get(
        status, "error")


def parse_body(request: HttpRequest) -> dict:
    """The request body as a JSON object, or an ApiError with the envelope's code (413, 400 invalid_json)."""
    return parse_json_object(request.body)


def parse_json_object(body: bytes) -> dict:
    """parse_body of a body already read (the hook calls answered before Django, plugins_app/api/hook_asgi.py)."""
    if len(body) > settings.LIBREFANG_MAX_BODY_BYTES:
        raise ApiError(413, "payload_too_large", f"request body exceeds {settings.LIBREFANG_MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"The request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ApiError(400, "invalid_json", "The request body is nested too deeply.") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "The request body must be a JSON object.")
    return data


def json_body(request: HttpRequest, schema):
    """The body validated against `schema`, parsed as JSON whatever its Content-Type says (curl -d sends
    application/x-www-form-urlencoded); an omitted body (or an empty multipart one, as some clients send
    "nothing") means the schema's defaults. Every route with a body reads it here, so all accept alike."""
    if not request.body.strip() or (request.content_type == "multipart/form-data"
                                    and not request.POST and not request.FILES):
        data = {}
    else:
        data = parse_body(request)
    try:
        return schema.model_validate(data)
    except PydanticValidationError as exc:
        raise ApiError(400, "validation_error", "The request does not match the expected shape.",
                       validation_details(exc.errors())) from exc
