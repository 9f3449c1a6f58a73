from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class InboxConfig(AppConfig):
    name = "django_inbox"
    label = "django_inbox"
    verbose_name = _("Transactional inbox")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .conf import inbox_settings
        from .registry import registry

        registry.autodiscover(inbox_settings.handlers_module)
        if inbox_settings.metrics:
            try:
                from .contrib.prometheus import install
            except ImportError:  # reported by check django_inbox.E015
                return
            install()
