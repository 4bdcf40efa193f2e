import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from config.keepalive import CloseAfterUnreadBody

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# An answer that leaves a large request body unread closes the connection (config/keepalive.py).
application = CloseAfterUnreadBody(get_wsgi_application())
# Import the URL conf (and with it every view, serializer and DRF module) now, while the
# worker starts, not in its first request: that import was ~190 ms of the first answer.
get_resolver().url_patterns  # noqa: B018 - the import is the point
