from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from console.views import advisor, approvals, escalations, events, gantt, metrics, operations, pages

urlpatterns = [
    path("", pages.home, name="home"),
    path("gantt/", gantt.gantt_page, name="gantt"),
    path("events/", events.event_log, name="events"),
    path("approvals/", approvals.approvals_queue, name="approvals"),
    path("approvals/<int:pk>/decide/", approvals.approval_decide_view, name="approval-decide"),
    path("operations/", operations.operations_list, name="operations"),
    path("operations/new/", operations.operation_new, name="operation-new"),
    path("operations/preview/", operations.operation_scope_preview, name="operation-preview"),
    path("operations/<int:pk>/", operations.operation_page, name="operation-detail"),
    path("operations/<int:pk>/cancel/", operations.operation_cancel_view, name="operation-cancel"),
    path("escalations/<str:hostname>/<str:action>/", escalations.host_escalation_view, name="host-escalation"),
    path("simulations/advisor/", advisor.advisor_page, name="advisor"),
    path("live/fragments/", pages.live_fragments, name="live-fragments"),
    path("healthz", pages.health_web, name="health-web"),
    path("healthz/workers", pages.health_workers, name="health-workers"),
    path("metrics", metrics.metrics, name="metrics"),
    path("login/", auth_views.LoginView.as_view(template_name="registration/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("fleet/", include("fleet.urls")),
    path("trains/", include("trains.urls")),
    path("api/", include("console.api.urls")),
    path("admin/", admin.site.urls),
]
