# Joins the three migrations that were written side by side (approvals, tenancy, alerts); changes nothing.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("plugins_app", "0006_alerts"),
        ("plugins_app", "0006_plugin_approvals"),
        ("plugins_app", "0006_tenancy"),
    ]

    operations = []
