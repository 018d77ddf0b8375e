"""/api/: the router, tokens, the OpenAPI schema and its browsable docs."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from console.api.views import advisor, auth, executors, fleet, fleet_apply, inventory, trains, work

router = DefaultRouter()
router.register("pools", inventory.PoolViewSet, basename="pool")
router.register("domains", inventory.DomainViewSet, basename="domain")
router.register("hosts", inventory.HostViewSet, basename="host")
router.register("components", inventory.ComponentViewSet, basename="component")
router.register("compatibility-rules", inventory.CompatibilityRuleViewSet, basename="compatibility-rule")
router.register("services", inventory.ServiceViewSet, basename="service")
router.register("optout-windows", fleet.OptOutWindowViewSet, basename="optout-window")
router.register("reservations", fleet.ReservationViewSet, basename="reservation")
router.register("operations", work.OperationViewSet, basename="operation")
router.register("host-tasks", work.HostTaskViewSet, basename="host-task")
router.register("work-items", executors.WorkItemViewSet, basename="work-item")
router.register("approvals", work.ApprovalViewSet, basename="approval")
router.register("events", work.EventViewSet, basename="event")
router.register("trains", trains.TrainViewSet, basename="train")
router.register("visits", trains.VisitViewSet, basename="visit")
router.register("upgrades", trains.UpgradeViewSet, basename="upgrade")
router.register("advisor-runs", advisor.AdvisorRunViewSet, basename="advisor-run")

app_name = "api"
urlpatterns = [
    path("auth/login/", auth.LoginView.as_view(), name="login"),
    path("auth/logout/", auth.LogoutView.as_view(), name="logout"),
    path("auth/logoutall/", auth.LogoutAllView.as_view(), name="logoutall"),
    path("auth/me/", auth.MeView.as_view(), name="me"),
    path("fleet/apply/", fleet_apply.FleetApplyView.as_view(), name="fleet-apply"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("", include(router.urls)),
]
