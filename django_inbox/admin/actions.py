"""The admin's actions: replay, force re-run, park, retry now and skip (ordered consumers), each
behind its own permission, confirmed on a page of its own (with a reason), reported with counts,
and audited with one ``LogEntry`` per changed row. They call :mod:`django_inbox.services`, as
``inbox_replay`` does. :class:`ConfirmedActions` is that machinery for any model admin whose
actions return an :class:`~django_inbox.services.ActionResult` (the outbox's replay uses it).

A user without an action's permission neither sees it nor can run it with a forged POST:
Django drops the actions the user may not run before dispatching.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import Truncator

from ..models import InboxMessage
from ..services import ActionResult, count_by_status, tally_by_status
from ..text import storable
from .action_specs import ACTIONS as ACTIONS
from .action_specs import Action as Action
from .selected import SAMPLE, actor_of, return_to, side_effects

Status = InboxMessage.Status
PERMISSION_PREFIX = "django_inbox."


def confirmed_action(specs: dict[str, Action], name: str) -> Any:
    """The admin action ``name`` of ``specs``, run through :class:`ConfirmedActions`."""
    spec = specs[name]

    @admin.action(permissions=[spec.permission], description=spec.description)
    def action(self: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return self._confirm_and_run(request, queryset, name)

    action.__name__ = name
    return action


if TYPE_CHECKING:
    _Base = admin.ModelAdmin[Any]
else:  # ModelAdmin is generic only in the type stubs
    _Base = object


class ConfirmedActions(_Base):
    """Actions confirmed on a page of their own (with a reason), behind their permission,
    reported with counts and audited with one ``LogEntry`` per changed row: the specs of
    ``action_specs``, made into actions by :func:`confirmed_action`."""

    action_specs: dict[str, Action] = {}
    #: What names a selected row on the confirmation page.
    sample_fields: tuple[str, ...] = ("message_id",)

    def _confirm_and_run(
        self, request: HttpRequest, selected: QuerySet[Any], name: str
    ) -> HttpResponse | None:
        spec = self.action_specs[name]
        back_to = return_to(request, selected)
        queryset, refused_elsewhere = selected, None
        if spec.only_from:
            queryset = selected.filter(status__in=spec.start)
            refused_elsewhere = selected.exclude(status__in=spec.start)
        reason = request.POST.get("reason", "").strip()
        error = ""
        if request.POST.get("confirm") == "yes":
            if spec.reason_required and not reason:
                error = "Say why: a reason is required for this action."
            elif reason != storable(reason):  # refused before anything changes: the audit
                error = "The reason holds a character the database cannot store (a NUL)."
            else:
                # Counted before the run: afterwards the re-run rows are no longer completed.
                elsewhere = (
                    count_by_status(refused_elsewhere) if refused_elsewhere is not None else {}
                )
                result = spec.run(
                    queryset,
                    actor=actor_of(request),
                    reason=reason,
                    via="admin",
                    keep=None,
                    **spec.options,
                )
                for status, count in elsewhere.items():
                    result.refused[f"{status} (not completed)"] += count
                self._audit(request, result, spec, reason)
                self._report(request, result, spec)
                if back_to is not None:  # from the message's page: back to it
                    opts = self.model._meta
                    page = f"admin:{opts.app_label}_{opts.model_name}_change"
                    return HttpResponseRedirect(reverse(page, args=[back_to]))
                return None
        # Read at most 10,001 rows: a "select all" of half a million is estimated, not counted.
        counts, estimated = tally_by_status(selected, also=spec.start)
        # Any eleven of the selected rows, newest first among them: in the list's order, a
        # selection of old rows behind a backlog of new ones would walk the whole backlog.
        sample = [
            {
                "pk": row["pk"],
                "status": row["status"],
                "label": " · ".join(str(row[f]) for f in self.sample_fields),
            }
            for row in sorted(
                selected.order_by().values("pk", "status", *self.sample_fields)[: SAMPLE + 1],
                key=lambda row: -row["pk"],
            )
        ]
        eligible = sum(n for status, n in counts.items() if status in spec.start)
        context = {
            **self.admin_site.each_context(request),
            "title": spec.title,
            "opts": self.model._meta,
            "action_name": name,
            "spec": spec,
            "counts": sorted(counts.items()),
            "eligible": eligible,
            "ineligible": sum(counts.values()) - eligible,
            "estimated": estimated,
            "total": sum(counts.values()),
            "sample": sample[:SAMPLE],
            "sample_more": len(sample) > SAMPLE,
            "return_to": back_to,
            "from_statuses": ", ".join(str(s) for s in spec.start),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "reason": reason,
            "error": error,
            "media": self.media,
            "side_effects": side_effects(queryset) if name == "force_rerun_messages" else [],
        }
        return TemplateResponse(
            request, "admin/django_inbox/inboxmessage/action_confirmation.html", context
        )

    def _audit(self, request: HttpRequest, result: ActionResult, spec: Action, reason: str) -> None:
        """One ``LogEntry`` per changed row: who, what, from which status, why."""
        content_type = ContentType.objects.get_for_model(self.model, for_concrete_model=False)
        entries = [
            LogEntry(
                user_id=int(request.user.pk or 0),
                content_type_id=content_type.pk,
                object_id=str(pk),
                object_repr=Truncator(f"{consumer}:{message_id}").chars(200),
                action_flag=CHANGE,
                change_message=f"{spec.verb} (was {status})"
                + (f". Reason: {reason}" if reason else ""),
            )
            for pk, consumer, message_id, status in result.rows
        ]
        LogEntry.objects.bulk_create(entries, batch_size=1000)

    def _report(self, request: HttpRequest, result: ActionResult, spec: Action) -> None:
        counts = ", ".join(f"{n:,} {status}" for status, n in sorted(result.changed.items()))
        if result.total:
            self.message_user(
                request,
                f"{spec.verb} {spec.counted(result.total)} ({counts})."
                + (f" {spec.done}" if spec.done else ""),
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request, f"{spec.verb} no {spec.noun or 'message'}.", messages.WARNING
            )
        if result.refused:
            refused = "; ".join(f"{n:,} {why}" for why, n in sorted(result.refused.items()))
            self.message_user(request, f"Left unchanged: {refused}.", messages.WARNING)


class ActionsMixin(ConfirmedActions):
    """The actions of :class:`~django_inbox.admin.InboxMessageAdmin` and their permissions."""

    actions = list(ACTIONS)
    action_specs = ACTIONS
    sample_fields = ("consumer", "message_id")
    replay_messages = confirmed_action(ACTIONS, "replay_messages")
    force_rerun_messages = confirmed_action(ACTIONS, "force_rerun_messages")
    park_messages = confirmed_action(ACTIONS, "park_messages")
    retry_messages_now = confirmed_action(ACTIONS, "retry_messages_now")
    skip_versions = confirmed_action(ACTIONS, "skip_versions")

    def _has(self, request: HttpRequest, codename: str) -> bool:
        return bool(request.user.has_perm(PERMISSION_PREFIX + codename))

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "replay_inboxmessage")

    def has_force_replay_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "force_replay_inboxmessage")

    def has_park_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "park_inboxmessage")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "retry_inboxmessage")

    def has_skip_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "skip_inboxmessage")
