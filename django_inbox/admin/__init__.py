"""The inbox's Django admin: triage screens and audited operator actions.

``InboxMessageAdmin`` is registered on the default admin site unless ``INBOX_ADMIN = False``.
To change it, subclass it, then unregister ours and register yours::

    from django.contrib import admin
    from django_inbox.admin import InboxMessageAdmin
    from django_inbox.models import InboxMessage

    admin.site.unregister(InboxMessage)

    @admin.register(InboxMessage)
    class MyInboxAdmin(InboxMessageAdmin):
        list_per_page = 200
"""

from __future__ import annotations

from django.contrib import admin

from ..conf import inbox_settings
from ..models import InboxMessage
from .options import InboxMessageAdmin

__all__ = ["InboxMessageAdmin"]

if inbox_settings.admin and not admin.site.is_registered(InboxMessage):
    admin.site.register(InboxMessage, InboxMessageAdmin)
