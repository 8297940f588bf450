from django.contrib.auth import views as auth_views
from django.urls import path

from plugins_app.api import api
from plugins_app.views import alerts as alert_views
from plugins_app.views import doctor as doctor_views
from plugins_app.views import engine as engine_views
from plugins_app.views import mcp as mcp_views
from plugins_app.views import memories as memory_views
from plugins_app.views import monitoring as monitoring_views
from plugins_app.views import parity as parity_views
from plugins_app.views import permissions as permission_views
from plugins_app.views import plugins as plugin_views
from plugins_app.views import tokens as token_views
from plugins_app.views import tools as tool_views

api_urls = api.urls
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="plugins_app/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("memories/", memory_views.memories_page, name="memories"),
    # Plugins
    path("", plugin_views.plugin_list, name="plugin_list"),
    path("create/", plugin_views.plugin_create, name="plugin_create"),
    path("create/check-name/", plugin_views.plugin_check_name, name="plugin_check_name"),
    path("install/", plugin_views.plugin_install, name="plugin_install"),
    path("plugins/<str:name>/", plugin_views.plugin_detail, name="plugin_detail"),
    path("plugins/<str:name>/test-hook/", plugin_views.plugin_test_hook, name="plugin_test_hook"),
    path("plugins/<str:name>/test-hook/example/", plugin_views.plugin_test_example, name="plugin_test_example"),
    # LibreFang's extra routes as dashboard controls (declared before plugin_action, which takes any action word)
    path("batch/", parity_views.batch_panel, name="parity_batch_panel"),
    path("batch/run/", parity_views.batch, name="parity_batch"),
    path("install/registry/", parity_views.registry_browser, name="parity_registry"),
    path("install/registry/install/", parity_views.registry_install, name="parity_registry_install"),
    path("engine/extras/", parity_views.engine_extras, name="parity_engine"),
    path("plugins/<str:name>/benchmark/", parity_views.benchmark, name="parity_benchmark"),
    path("plugins/<str:name>/prewarm/", parity_views.prewarm, name="parity_prewarm"),
    path("plugins/<str:name>/export.tar.gz", parity_views.export, name="parity_export"),
    path("plugins/<str:name>/update-check/", parity_views.update_check, name="parity_update_check"),
    path("plugins/<str:name>/state/", parity_views.state, name="parity_state"),
    path("plugins/<str:name>/state/wipe/", parity_views.state_wipe, name="parity_state_wipe"),
    path("plugins/<str:name>/config/", parity_views.config, name="parity_config"),
    path("plugins/<str:name>/config/env/", parity_views.env_set, name="parity_env_set"),
    path("plugins/<str:name>/config/advanced/", parity_views.advanced_set, name="parity_advanced_set"),
    path("plugins/<str:name>/permissions/approve/", permission_views.plugin_approve, name="plugin_approve"),
    path("plugins/<str:name>/<str:action>/", plugin_views.plugin_action, name="plugin_action"),
    # Context engine, doctor, tokens
    path("engine/", engine_views.engine_page, name="engine"),
    path("engine/config/", engine_views.engine_config, name="engine_config"),
    path("engine/health/", engine_views.engine_health, name="engine_health"),
    path("engine/mcp/", mcp_views.mcp_page, name="mcp"),
    path("doctor/", doctor_views.doctor_page, name="doctor"),
    path("tokens/", token_views.tokens_page, name="tokens"),
    path("tokens/new/", token_views.token_create, name="token_create"),
    path("tokens/<int:token_id>/revoke/", token_views.token_revoke, name="token_revoke"),
    # Monitoring: charts, traces, workers
    path("metrics/", monitoring_views.metrics_page, name="metrics"),
    path("metrics/chart.json", monitoring_views.chart_data, name="chart_data"),
    path("traces/", monitoring_views.traces_page, name="traces"),
    path("traces/<str:trace_id>/", monitoring_views.trace_detail, name="trace_detail"),
    path("workers/", monitoring_views.workers_page, name="workers"),
    path("workers/start-again/", monitoring_views.start_given_up_again, name="supervisor_start_again"),
    path("alerts/", alert_views.alerts_page, name="alerts"),
    path("alerts/test/", alert_views.alerts_test, name="alerts_test"),
    path("alerts/rules/", alert_views.alerts_configure, name="alerts_configure"),
    # WASM tools
    path("tools/", tool_views.tools_page, name="tools"),
    path("tools/install/", tool_views.tool_install, name="tool_install"),
    path("tools/execute/", tool_views.tool_execute, name="tool_execute"),
    path("tools/<str:tool_id>/<str:action>/", tool_views.tool_action, name="tool_action"),
    # API
    # The same API under /api/v1/ (LibreFang mounts both); a separate namespace keeps reversing unambiguous.
    # /api/v1/ comes first: /api/'s catch-all JSON 404 route would otherwise swallow it.
    path("api/v1/", (api_urls[0], "api-v1", "api-v1")),
    path("api/", api_urls),
]
