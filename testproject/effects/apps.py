from django.apps import AppConfig


class EffectsConfig(AppConfig):
    """Handlers the crash tests drive: each run writes one Effect row."""

    name = "effects"
    default_auto_field = "django.db.models.BigAutoField"
