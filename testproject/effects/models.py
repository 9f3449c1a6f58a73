from django.db import models


class Effect(models.Model):
    """One row per committed handler run. Deliberately no unique constraint: a doubled
    effect shows up as two rows."""

    consumer = models.CharField(max_length=100)
    message_id = models.CharField(max_length=255)
    attempt = models.IntegerField()
    pid = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.consumer}:{self.message_id} attempt {self.attempt}"
