"""The simulator's Celery task: a queued advisor run. Thin, carries an id, harmless twice."""

from celery import shared_task


# The name is the one queued messages carry from before the simulator had its own app.
@shared_task(name="opsplanner.tasks.advisor_run")
def advisor_run(run_id: int) -> None:
    """Run a queued advisor run, a domain-size advice or a live forecast (minutes: simulations in scratch
    databases). A second delivery leaves alone a run that is over or that a live worker holds, and takes
    over one whose worker died mid-run (advisor_run_execute)."""
    from simulation.advisor_runs import advisor_run_execute

    advisor_run_execute(run_id=run_id)


@shared_task(name="simulation.tasks.advisor_runs_recover")
def advisor_runs_recover() -> int:
    """Every minute: runs whose worker died whole are handed to a worker again (advisor_runs_recover)."""
    from simulation.advisor_runs import advisor_runs_recover as recover

    return len(recover())
