"""The product's URLs plus /bench/trivial/: the framework's limit for the HTTP scenario.

The trivial endpoint goes through the same authentication (agent token), throttle, renderer
and middleware as the agent endpoints, then runs one query. It exists only here, never in
the product's URL conf.
"""

from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.authentication import AgentTokenAuthentication
from agents.throttling import CredentialRateThrottle
from config.urls import handler404, handler500  # noqa: F401
from config.urls import urlpatterns as product_urlpatterns
from jobqueue.models import JobAgent


class TrivialView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    throttle_classes = [CredentialRateThrottle]
    schema = None  # not part of the published API

    def get(self, request):
        name = JobAgent.objects.filter(id=request.user.job_agent_id).values_list(
            "name", flat=True
        ).first()
        return Response({"name": name})


urlpatterns = [*product_urlpatterns, path("bench/trivial/", TrivialView.as_view())]
