from django.urls import include, path

urlpatterns = [path("", include("plugins_app.urls"))]
