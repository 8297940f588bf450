"""The doctor page: every runtime (available, version, launcher, install hint) and every plugin's findings."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from plugins_app.selectors.doctor import doctor


@login_required
@require_GET
def doctor_page(request):
    report = doctor(fresh=bool(request.GET.get("fresh")))
    return render(request, "plugins_app/doctor.html", {"report": report})
