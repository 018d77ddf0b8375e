"""Trains get a pace (domain-synchronous or sliding); a sliding visit has one operation per upgrade and
batch of hosts it releases, so (visit, upgrade) is no longer unique."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('trains', '0004_upgrade_budget_and_deadline'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='visitoperation',
            name='visit_operation_once',
        ),
        migrations.AddField(
            model_name='train',
            name='pace',
            field=models.CharField(choices=[('domain', "Domain-synchronous: the next domain starts when the visit's last host is back"), ('sliding', 'Sliding: each host back lets a host of the next domain start')], default='domain', help_text="domain: whole domains at a time; sliding: hosts of the next domain start as hosts come back, never more than a visit's worth out", max_length=8),
        ),
        migrations.AddIndex(
            model_name='visitoperation',
            index=models.Index(fields=['visit', 'upgrade'], name='visit_operation_visit_upgrade'),
        ),
        migrations.AddConstraint(
            model_name='train',
            constraint=models.CheckConstraint(condition=models.Q(('pace__in', ['domain', 'sliding'])), name='train_pace_known', violation_error_message="A train's pace is 'domain' or 'sliding'."),
        ),
    ]
