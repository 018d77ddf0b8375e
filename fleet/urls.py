from django.urls import include, path

from fleet.views import hosts, pools

app_name = "fleet"
urlpatterns = [
    path("pools/<str:name>/", pools.pool_hosts, name="pool-hosts"),
    path("hosts/<str:hostname>/", hosts.host_page, name="host"),
    # Service owners' pages: their services, opt-out windows and reservations, next visits.
    path("services/", include("fleet.urls_owners")),
]
