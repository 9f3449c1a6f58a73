"""The admin's view of an ordered consumer's keys: on a message, its key's applied sequence
and what it waits for; and a page listing all versions of one key in sequence order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from ..conf import inbox_settings
from ..models import InboxKey, InboxMessage
from .guards import refuse_unstorable_query
from .render import key_versions

Status = InboxMessage.Status

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[InboxMessage]
else:  # ModelAdmin is generic only in the type stubs
    _Base = object


class KeyViewMixin(_Base):
    """The ``ordering`` field of :class:`~django_inbox.admin.InboxMessageAdmin` and its key
    view (``key/?consumer=…&key=…``)."""

    #: The most versions the key view lists.
    KEY_VIEW_LIMIT = 500

    @admin.display(description="ordering")
    def ordering_display(self, obj: InboxMessage) -> SafeString | str:
        """For an ordered consumer's keyed message: its key's applied sequence, what this one
        waits for, and a link to the key's view."""
        if not obj.key or not inbox_settings.ordered(obj.consumer):
            return 'not ordered (a consumer with "ordered": True orders messages with a key)'
        state = InboxKey.objects.filter(consumer=obj.consumer, key=obj.key).first()
        first = inbox_settings.policy(obj.consumer).first_sequence
        applied = first - 1 if state is None else state.applied_sequence
        if applied < first:
            where = "no version of this key applied yet"
        else:
            where = f"key applied up to sequence {applied}"
        if obj.status == Status.WAITING:
            where += f"; this message waits for sequence {applied + 1}"
        url = (
            reverse("admin:django_inbox_inboxmessage_key")
            + "?"
            + urlencode({"consumer": obj.consumer, "key": obj.key})
        )
        return format_html(
            '{} — <a href="{}" id="inbox-key-link">all versions of this key</a>', where, url
        )

    def get_urls(self) -> list[Any]:
        urls = super().get_urls()
        view = self.admin_site.admin_view(self.key_view)
        return [path("key/", view, name="django_inbox_inboxmessage_key"), *urls]

    def key_view(self, request: HttpRequest) -> HttpResponse:
        """The versions of one key of an ordered consumer (its messages with a sequence), in
        sequence order, and a link to the search for all its messages."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        refuse_unstorable_query(request)
        consumer = request.GET.get("consumer", "")
        key = request.GET.get("key", "")
        if not consumer or not key:
            raise BadRequest("the key view needs ?consumer=…&key=…")
        context = {
            **self.admin_site.each_context(request),
            "title": f"Key {key}",
            "opts": self.model._meta,
            "view": key_versions(consumer, key, self.KEY_VIEW_LIMIT),
            "limit": self.KEY_VIEW_LIMIT,
            "search": f"?{urlencode({'consumer': consumer, 'q': f'key:{key}'})}",
        }
        return TemplateResponse(request, "admin/django_inbox/inboxmessage/key_view.html", context)
