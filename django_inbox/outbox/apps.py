from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class OutboxConfig(AppConfig):
    name = "django_inbox.outbox"
    #: Not "outbox": a project may well have an app of that name.
    label = "django_inbox_outbox"
    verbose_name = _("Transactional outbox")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .. import companions
        from . import checks  # noqa: F401  (registers the outbox's system check)
        from .services import OutboxCompanion

        companions.register(self.name, OutboxCompanion())
