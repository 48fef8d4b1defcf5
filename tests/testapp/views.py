"""An async view that uses the async client, as a project's ASGI view would."""

from __future__ import annotations

import json

from django.http import HttpRequest, JsonResponse

from django_weft import ResultTimeout, client


async def greet(request: HttpRequest) -> JsonResponse:
    """POST ``{"greeting": ..., "name": ...}``: start a run of ``tests.async.greet``, send
    it the name, and wait (``wait`` seconds, 20 by default) for the greeting it makes."""
    body = json.loads(request.body or b"{}")
    handle = await client.astart("tests.async.greet", args=[body.get("greeting", "Hello")])
    await handle.asignal("name", body.get("name", "world"))
    try:
        result = await handle.aresult(timeout=float(body.get("wait", 20)))
    except ResultTimeout as exc:
        return JsonResponse({"run_id": handle.run_id, "status": exc.status}, status=202)
    return JsonResponse({"run_id": handle.run_id, "status": await handle.astatus(), "result": result})
