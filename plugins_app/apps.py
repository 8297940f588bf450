from django.apps import AppConfig


class PluginsAppConfig(AppConfig):
    name = "plugins_app"
    verbose_name = "LibreFang plugins"
    default_auto_field = "django.db.models.BigAutoField"
