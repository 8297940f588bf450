from django.urls import path, re_path

from plugins_app import consumers

websocket_urlpatterns = [
    path("ws/stderr/", consumers.StderrConsumer.as_asgi()),
    re_path(r"^ws/stderr/(?P<plugin>[A-Za-z0-9][A-Za-z0-9_-]{0,127})/$", consumers.StderrConsumer.as_asgi()),
    path("ws/metrics/", consumers.MetricsConsumer.as_asgi()),
    # Last: every other path gets a clean close (4404) instead of the router's "No route found" error (a 500).
    re_path(r"^.*$", consumers.NotFoundConsumer.as_asgi()),
]
