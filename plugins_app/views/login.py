"""Login throttling (django-axes, configured in librefang_site/settings.py): which address a login comes from, and
the page a locked-out login gets.

The client address is the TCP peer unless that peer is a proxy listed in LIBREFANG_TRUSTED_PROXIES; only then is
X-Forwarded-For read, from the right, skipping trusted proxies, so a client cannot pick its own address by sending
the header itself.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.shortcuts import render


def _networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(item, strict=False) for item in settings.LIBREFANG_TRUSTED_PROXIES]


def _trusted(address: str, networks) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in net for net in networks)


def client_ip(request) -> str:
    """The address throttling counts failures against (AXES_CLIENT_IP_CALLABLE)."""
    peer = request.META.get("REMOTE_ADDR", "") or ""
    networks = _networks()
    if not networks or not _trusted(peer, networks):
        return peer
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    for address in reversed(forwarded):
        if not _trusted(address, networks):
            return address
    return forwarded[0] if forwarded else peer


def locked_out(request, original_response=None, credentials=None):
    """The login page again, with why it refuses (AXES_LOCKOUT_CALLABLE); 429 like axes' own answer."""
    minutes = round(settings.AXES_COOLOFF_TIME.total_seconds() / 60)
    message = (f"Too many failed logins for this username from your address: try again in {minutes} minutes. "
               "An owner can lift the lock with `librefang axes_reset_username <username>`.")
    return render(request, "plugins_app/login.html", {"locked_out": message, "next": request.POST.get("next", "")},
                  status=429)
