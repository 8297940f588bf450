"""LibreFang's /context-engine routes beyond the hooks and metrics of plugins_app/api/context_engine.py: per-agent
metrics and the effective sandbox policy of every plugin (both reads, viewer role)."""

from __future__ import annotations

from ninja import Query

from plugins_app.api.errors import json_response
from plugins_app.api.security import ActionRouter
from plugins_app.schemas import ErrorEnvelope
from plugins_app.schemas.parity import PerAgentMetricsOut, SandboxPolicyOut
from plugins_app.selectors import sandbox_policy as sandbox_selectors
from plugins_app.selectors.agent_metrics import per_agent_metrics

router = ActionRouter(tags=["context-engine"])
E = {400: ErrorEnvelope, 401: ErrorEnvelope, 403: ErrorEnvelope}


@router.get("/metrics/per-agent", response={200: PerAgentMetricsOut, **E},
            operation_id="context_engine_metrics_per_agent")
def per_agent(request, hours: float | None = Query(None, gt=0, le=24 * 365), agent_id: str | None = Query(None,
                                                                                                       max_length=200)):
    """Calls, failures and latency per agent and hook, from the stored traces of agent calls (LibreFang's route is
    a stub that always answers an empty map)."""
    return json_response(per_agent_metrics(hours, agent_id))


@router.get("/sandbox-policy", response={200: SandboxPolicyOut, **E},
            operation_id="context_engine_sandbox_policy")
def sandbox_policy(request):
    """What each installed plugin's hooks may reach, as its manifest sets it: network, filesystem (its own dir and
    data dir), resource limits (null: the service default), environment."""
    return json_response(sandbox_selectors.sandbox_policy())
