"""Service owners' pages (under /fleet/services/, names in the fleet namespace)."""

from django.urls import path

from fleet.views import owners

urlpatterns = [
    path("", owners.my_services, name="services"),
    path("<str:name>/", owners.service_page, name="service"),
    path("<str:name>/optouts/new/", owners.optout_new, name="optout-new"),
    path("<str:name>/optouts/<int:pk>/edit/", owners.optout_edit, name="optout-edit"),
    path("<str:name>/optouts/<int:pk>/cancel/", owners.optout_cancel, name="optout-cancel"),
    path("<str:name>/reservations/new/", owners.reservation_new, name="reservation-new"),
    path("<str:name>/reservations/<int:pk>/edit/", owners.reservation_edit, name="reservation-edit"),
    path("<str:name>/reservations/<int:pk>/cancel/", owners.reservation_cancel, name="reservation-cancel"),
]
