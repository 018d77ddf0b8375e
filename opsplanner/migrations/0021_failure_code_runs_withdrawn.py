# A host the pre-return gate refuses only for running a withdrawn version fails with the code
# runs_withdrawn, which no upgrade's failure policy counts.

from django.db import migrations, models

from opsplanner.dbconstraints import SqliteRestoreCompositeForeignKey, SqliteSuspendCompositeForeignKey

# SQLite rebuilds opsplanner_hosttask for the new check: the composite-key triggers of leases and
# work items on it go and come back (as in 0012 and 0014; migrations keep their own copy).
TASK_HOST_KEYS = [
    {
        "name": "lease_task_host_fk",
        "table": "opsplanner_lease",
        "columns": ["host_task_id", "host_id"],
        "ref_table": "opsplanner_hosttask",
        "ref_columns": ["id", "host_id"],
        "message": "lease_task_host_fk: a lease's host must be its host task's host",
    },
    {
        "name": "work_item_task_host_fk",
        "table": "opsplanner_workitem",
        "columns": ["host_task_id", "host_id"],
        "ref_table": "opsplanner_hosttask",
        "ref_columns": ["id", "host_id"],
        "message": "work_item_task_host_fk: a work item's host must be its host task's host",
    },
]


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0011_version_withdrawn_by'),
        ('opsplanner', '0020_waiting_code_newer_pending'),
    ]

    operations = [
        *(SqliteSuspendCompositeForeignKey(**key) for key in TASK_HOST_KEYS),
        migrations.RemoveConstraint(
            model_name='hosttask',
            name='host_task_failure_code_fits_state',
        ),
        migrations.AlterField(
            model_name='hosttask',
            name='failure_code',
            field=models.CharField(blank=True, choices=[('drain_failed', 'Drain failed'), ('execute_failed', 'Execution failed'), ('unknown_version', 'Executor reported a version not in the catalogue'), ('check_failed', 'Verification failed'), ('not_returnable', 'Pre-return gate refused'), ('runs_withdrawn', 'Pre-return gate refused: runs a withdrawn version'), ('return_failed', 'Return to service failed'), ('cancelled', 'Cancelled'), ('superseded', 'Superseded by a newer version'), ('deferred', 'Deferred to the next cycle')], default='', max_length=16),
        ),
        migrations.AddConstraint(
            model_name='hosttask',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('failure_code__in', ['drain_failed', 'execute_failed', 'unknown_version', 'check_failed', 'not_returnable', 'runs_withdrawn', 'return_failed']), ('state', 'failed')), models.Q(('failure_code__in', ['cancelled', 'superseded', 'deferred']), ('state', 'cancelled')), models.Q(models.Q(('state__in', ['failed', 'cancelled']), _negated=True), ('failure_code', '')), _connector='OR'), name='host_task_failure_code_fits_state', violation_error_message='A failed task has the code of its failure, a cancelled task the code cancelled, superseded or deferred, and no other task has a failure code.'),
        ),
        *(SqliteRestoreCompositeForeignKey(**key) for key in TASK_HOST_KEYS),
    ]
