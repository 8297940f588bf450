from django.contrib.auth import views as auth_views
from django.urls import path

from plugins_app.views import plugins as plugin_views
from plugins_app.api import api

api_urls = api.urls
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="plugins_app/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", plugin_views.plugin_list, name="plugin_list"),
    path("plugins/<str:name>/", plugin_views.plugin_detail, name="plugin_detail"),
    path("api/", api_urls),
    # The same API under /api/v1/ (LibreFang mounts both); a separate namespace keeps reversing unambiguous.
    path("api/v1/", (api_urls[0], "api-v1", "api-v1")),
]
