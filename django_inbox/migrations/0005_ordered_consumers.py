"""Ordered consumers: a row's ``sequence``, the ``waiting`` and ``skipped`` statuses, and the
per-key table of applied sequences, and the permission to skip a version. Adding a nullable
column rewrites nothing."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_inbox', '0004_received_brin'),
    ]

    operations = [
        migrations.CreateModel(
            name='InboxKey',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('consumer', models.CharField(max_length=100)),
                ('key', models.CharField(max_length=255)),
                ('applied_sequence', models.BigIntegerField(help_text='The highest sequence of this key whose message completed (or was skipped).')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                'verbose_name': 'inbox key',
                'verbose_name_plural': 'inbox keys',
            },
        ),
        migrations.AddField(
            model_name='inboxmessage',
            name='sequence',
            field=models.BigIntegerField(blank=True, help_text="The key's version (aggregate version); ordered consumers apply in order.", null=True),
        ),
        migrations.AlterField(
            model_name='inboxmessage',
            name='status',
            field=models.CharField(choices=[('received', 'received'), ('in_progress', 'in progress'), ('completed', 'completed'), ('failed', 'failed'), ('dead', 'dead'), ('parked', 'parked'), ('waiting', 'waiting'), ('skipped', 'skipped')], default='received', max_length=20),
        ),
        migrations.AddConstraint(
            model_name='inboxkey',
            constraint=models.UniqueConstraint(fields=('consumer', 'key'), name='django_inbox_unique_key'),
        ),
        migrations.AlterModelOptions(
            name='inboxmessage',
            options={'permissions': [('replay_inboxmessage', 'Can replay dead or parked inbox messages'), ('force_replay_inboxmessage', 'Can re-run completed inbox messages'), ('park_inboxmessage', 'Can park inbox messages'), ('retry_inboxmessage', 'Can retry failed inbox messages now'), ('skip_inboxmessage', "Can skip versions of ordered consumers' messages"), ('view_payload_inboxmessage', 'Can see inbox message payloads and headers')], 'verbose_name': 'inbox message', 'verbose_name_plural': 'inbox messages'},
        ),
    ]
