"""Database-level guarantees Django cannot declare: a host's domain belongs to the host's pool, and
an installed version is a version of the component it is installed as."""

from django.db import migrations

from opsplanner.dbconstraints import CompositeForeignKey


class Migration(migrations.Migration):
    dependencies = [("fleet", "0001_initial")]

    operations = [
        CompositeForeignKey(
            name="host_domain_in_host_pool",
            table="fleet_host",
            columns=["domain_id", "pool_id"],
            ref_table="fleet_maintenancedomain",
            ref_columns=["id", "pool_id"],
            message="host_domain_in_host_pool: a host's domain must belong to the host's pool",
        ),
        CompositeForeignKey(
            name="installed_version_of_component",
            table="fleet_installedversion",
            columns=["version_id", "component_id"],
            ref_table="fleet_componentversion",
            ref_columns=["id", "component_id"],
            message="installed_version_of_component: the version must be a version of the component",
        ),
    ]
