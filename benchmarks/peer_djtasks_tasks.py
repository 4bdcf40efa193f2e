"""The no-op task of the django-tasks-db peer (counts its runs, in this process)."""

from django_tasks import task

LAST = {"n": 0}


@task()
def noop(i):
    LAST["n"] += 1
