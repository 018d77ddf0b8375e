"""Service owners' pages (under /fleet/services/, names in the fleet namespace)."""

from django.urls import path

from fleet.views import owners

urlpatterns = [
    path("", owners.my_services, name="services"),
]
