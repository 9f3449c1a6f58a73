from django.db import models


class Effect(models.Model):
    """One row per committed handler run. Deliberately no unique constraint: a doubled
    effect shows up as two rows."""

    consumer = models.CharField(max_length=100)
    message_id = models.CharField(max_length=255)
    attempt = models.IntegerField()
    pid = models.IntegerField()
    rerun = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.consumer}:{self.message_id} attempt {self.attempt}"


class OrderedRun(models.Model):
    """One row per committed run of the ordered consumer's handler: which version of which
    key, and when the handler started and ended (to show that runs of a key never overlap)."""

    key = models.CharField(max_length=255)
    sequence = models.BigIntegerField(null=True)
    message_id = models.CharField(max_length=255)
    started = models.FloatField()
    ended = models.FloatField()
    pid = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.key}@{self.sequence}"


class Projection(models.Model):
    """A projection the ``projection`` consumer folds its versions into, in order: ``value``
    depends on the order the versions were applied in, so a rebuild that ran them in another
    order (or twice, or not at all) ends with another value."""

    key = models.CharField(max_length=255, unique=True)
    value = models.BigIntegerField(default=0)
    version = models.BigIntegerField(default=0)
    reruns = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.key}@{self.version}"
