"""The no-op task of the django-tasks-db peer (notes when it last ran, in this process)."""

import time

from django_tasks import task

LAST = {"n": 0, "t": 0.0}


@task()
def noop(i):
    LAST["n"] += 1
    LAST["t"] = time.time()
