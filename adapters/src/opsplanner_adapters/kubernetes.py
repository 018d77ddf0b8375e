"""Draining and undraining a Kubernetes node, the way `kubectl drain` does it.

Drain: cordon the node (spec.unschedulable) with an annotation saying OpsPlanner cordoned it, list
the pods on it, leave DaemonSet and mirror pods alone, refuse pods no controller would recreate
(unless forced), evict the rest through the eviction subresource (policy/v1, which honours
PodDisruptionBudgets; a 429 is retried after a pause), and wait until they are gone. At the deadline
the drain fails naming the pods still there and what blocks each. Undrain: uncordon only a node
that carries our annotation; a node someone else cordoned stays cordoned.

Uses lightkube (a maintained client); nothing here knows about OpsPlanner's API."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
from lightkube import ALL_NS, ApiError, Client
from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

CORDONED_BY = "opsplanner.io/cordoned-by"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
MAX_REASON = 480  # the API keeps 500 characters of a reason


@dataclass(frozen=True)
class DrainSettings:
    force: bool = False  # evict pods no controller would recreate (they are lost)
    grace_seconds: int | None = None  # the pods' termination grace; None: each pod's own
    retry_pause_s: float = 5.0  # after a 429 (a budget said no), as kubectl waits
    poll_s: float = 1.0  # how often to look whether evicted pods are gone


@dataclass
class Outcome:
    """What to report: done or failed, a reason for people, a result for the record."""

    ok: bool
    reason: str
    result: dict[str, Any] = field(default_factory=dict)
    abandoned: bool = False  # the item is no longer ours (lease lost): report nothing


@dataclass
class _Plan:
    evict: list[Pod]
    skipped: dict[str, list[str]]
    refused: list[str]


def _meta(obj: Pod | Node) -> ObjectMeta:
    """An object's metadata. The API always sends it; the models type it optional (for objects a
    client builds), so one read from the API without it is a broken server, said as such."""
    if obj.metadata is None:
        raise ValueError(f"a {type(obj).__name__} from the Kubernetes API without metadata")
    return obj.metadata


def _pod_name(pod: Pod) -> str:
    """A pod's name: always set on a pod read from the API (optional in the model, as _meta says)."""
    name = _meta(pod).name
    if name is None:
        raise ValueError("a Pod from the Kubernetes API without a name")
    return name


def pod_key(pod: Pod) -> str:
    return f"{_meta(pod).namespace}/{_meta(pod).name}"


def _controller(pod: Pod) -> Any:
    return next((ref for ref in _meta(pod).ownerReferences or [] if ref.controller), None)


def plan_pods(pods: list[Pod], *, force: bool) -> _Plan:
    """Sort the node's pods as `kubectl drain --ignore-daemonsets --delete-emptydir-data` does."""
    plan = _Plan(evict=[], skipped={"daemonset": [], "mirror": []}, refused=[])
    for pod in pods:
        annotations = _meta(pod).annotations or {}
        controller = _controller(pod)
        finished = pod.status is not None and pod.status.phase in ("Succeeded", "Failed")
        if MIRROR_ANNOTATION in annotations:
            plan.skipped["mirror"].append(pod_key(pod))  # the kubelet's static pod: the API cannot remove it
        elif controller is not None and controller.kind == "DaemonSet":
            plan.skipped["daemonset"].append(pod_key(pod))  # its DaemonSet would put it right back
        elif controller is None and not finished and not force:
            plan.refused.append(pod_key(pod))
        else:
            plan.evict.append(pod)
    return plan


def _budget_reason(error: ApiError) -> str:
    """Which budget said no, from the 429's DisruptionBudget cause."""
    details = error.status.details
    for cause in (details.causes if details and details.causes else []) or []:
        match = re.match(r"The disruption budget (\S+) (.*)", cause.message or "")
        if match:
            return f"PodDisruptionBudget {match.group(1)} ({match.group(2)})"
    return f"a PodDisruptionBudget ({error.status.message})"


class KubeDrainer:
    """Drain and undrain nodes through one lightkube client. `sleep` and `clock` are injectable so
    that tests can run it without waiting out real pauses when they do not need to."""

    def __init__(
        self,
        client: Client,
        settings: DrainSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.settings = settings or DrainSettings()
        self.clock = clock
        self.sleep = sleep

    # Cordon -----------------------------------------------------------------------------------------
    def cordon(self, node_name: str, *, owner: str) -> bool:
        """Cordon the node; True when it is ours (we cordoned it now or earlier), False when someone
        else had already cordoned it (then it is left as it is, without our annotation)."""
        for _attempt in range(2):
            try:
                return self._cordon_once(node_name, owner=owner)
            except ApiError as error:
                if error.status.code != 409:  # 409: the node changed since our read; read it again
                    raise
        return self._cordon_once(node_name, owner=owner)

    def _cordon_once(self, node_name: str, *, owner: str) -> bool:
        node = self.client.get(Node, node_name)
        annotations = _meta(node).annotations or {}
        cordoned = bool(node.spec is not None and node.spec.unschedulable)
        if CORDONED_BY in annotations and cordoned:
            return True
        if cordoned:
            return False
        # Not cordoned (our annotation, if any, outlived a `kubectl uncordon`): cordon it now.
        # resourceVersion makes the patch conditional: a cordon by someone else in between wins (409).
        patch = {
            "metadata": {"annotations": {CORDONED_BY: owner}, "resourceVersion": _meta(node).resourceVersion},
            "spec": {"unschedulable": True},
        }
        self.client.patch(Node, node_name, patch, patch_type=PatchType.MERGE)
        return True

    def undrain(self, node_name: str) -> Outcome:
        """Uncordon the node if we cordoned it (and drop our annotation); otherwise leave it."""
        for _attempt in range(3):
            try:
                node = self.client.get(Node, node_name)
            except ApiError as error:
                return Outcome(False, f"node {node_name}: {error.status.message}", {"node": node_name})
            annotations = _meta(node).annotations or {}
            cordoned = bool(node.spec is not None and node.spec.unschedulable)
            result: dict[str, Any] = {"node": node_name, "uncordoned": False}
            if CORDONED_BY not in annotations:
                if cordoned:
                    why = f"node {node_name} left cordoned: it was cordoned by someone else, not by OpsPlanner"
                    return Outcome(True, why, {**result, "cordoned_by_someone_else": True})
                return Outcome(True, f"node {node_name} was not cordoned", result)
            patch = {
                "metadata": {"annotations": {CORDONED_BY: None}, "resourceVersion": _meta(node).resourceVersion},
                "spec": {"unschedulable": None},
            }
            try:
                self.client.patch(Node, node_name, patch, patch_type=PatchType.MERGE)
            except ApiError as error:
                if error.status.code == 409:  # changed under us: read it again
                    continue
                return Outcome(False, f"node {node_name}: {error.status.message}", result)
            return Outcome(True, f"node {node_name} uncordoned", {**result, "uncordoned": True})
        return Outcome(False, f"node {node_name} kept changing; not uncordoned", {"node": node_name})

    # Drain ------------------------------------------------------------------------------------------
    def drain(self, node_name: str, *, owner: str, deadline: float, keep_going: Callable[[], bool]) -> Outcome:
        """Cordon and empty the node by `deadline` (a `clock` value). `keep_going` is asked between
        rounds (the caller heartbeats there); False abandons the drain."""
        result: dict[str, Any] = {"node": node_name}
        try:
            result["cordoned_by_us"] = self.cordon(node_name, owner=owner)
            pods = list(self.client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": node_name}))
        except ApiError as error:
            return Outcome(False, f"node {node_name}: {error.status.message}", result)
        except httpx2.TransportError as error:
            return Outcome(False, f"node {node_name}: the Kubernetes API did not answer ({error})", result)
        plan = plan_pods(pods, force=self.settings.force)
        result["skipped"] = plan.skipped
        if plan.refused:
            names = ", ".join(plan.refused)
            reason = f"node {node_name}: pods with no controller would be lost (set force to evict them): {names}"
            return Outcome(False, _cut(reason), {**result, "refused": plan.refused})
        return self._evict_all(node_name, plan.evict, deadline, keep_going, result)

    def _evict_all(
        self, node_name: str, pods: list[Pod], deadline: float, keep_going: Callable[[], bool], result: dict[str, Any]
    ) -> Outcome:
        to_evict = {pod_key(p): p for p in pods}
        refusals: dict[str, str] = {}  # why each pod still to evict was refused last
        evicted: dict[str, str | None] = {}  # key -> uid of the pod we evicted (a new pod by that name is not it)
        terminating: dict[str, str | None] = {}  # evicted and not seen gone yet
        while True:
            pause = self.settings.poll_s
            for key, pod in list(to_evict.items()):
                why = self._evict(pod)
                if why is None:
                    evicted[key] = terminating[key] = _meta(pod).uid
                    refusals.pop(key, None)
                    del to_evict[key]
                elif why.startswith("forbidden"):
                    return Outcome(False, _cut(f"node {node_name}: eviction of {key} {why}"), result)
                else:
                    refusals[key] = why
                    pause = self.settings.retry_pause_s
            terminating = {key: terminating[key] for key in self._still_there(terminating)}
            result["evicted"] = sorted(evicted)
            if not to_evict and not terminating:
                return Outcome(True, f"node {node_name} drained: {len(evicted)} pods evicted", result)
            if self.clock() + pause > deadline:
                blocking = {**refusals, **dict.fromkeys(terminating, "terminating")}
                return self._timed_out(node_name, blocking, result)
            if not keep_going():
                return Outcome(False, "the item is no longer ours", result, abandoned=True)
            self.sleep(pause)

    def _evict(self, pod: Pod) -> str | None:
        """Ask for one eviction: None when granted (or the pod is already gone), else why not."""
        grace = self.settings.grace_seconds
        name, namespace = _pod_name(pod), _meta(pod).namespace
        eviction = Pod.Eviction(
            metadata=ObjectMeta(name=name, namespace=namespace),
            deleteOptions=DeleteOptions(gracePeriodSeconds=grace) if grace is not None else None,
        )
        try:
            self.client.create(eviction, name, namespace=namespace)
        except ApiError as error:
            code = error.status.code
            if code == 404:
                return None
            if code == 429:
                return f"blocked by {_budget_reason(error)}"
            if code == 403:
                return f"forbidden: {error.status.message}"
            return f"eviction refused ({code}): {error.status.message}"
        except httpx2.TransportError as error:
            return f"the Kubernetes API did not answer ({error})"
        return None

    def _still_there(self, evicted: dict[str, str | None]) -> list[str]:
        waiting = []
        for key, uid in evicted.items():
            namespace, name = key.split("/", 1)
            try:
                pod = self.client.get(Pod, name, namespace=namespace)
            except ApiError as error:
                if error.status.code == 404:
                    continue
                waiting.append(key)
                continue
            except httpx2.TransportError:
                waiting.append(key)
                continue
            if _meta(pod).uid == uid:
                waiting.append(key)
        return sorted(waiting)

    def _timed_out(self, node_name: str, blocking: dict[str, str], result: dict[str, Any]) -> Outcome:
        result["blocking"] = dict(sorted(blocking.items()))
        pods = "; ".join(f"{key} {why}" for key, why in sorted(blocking.items()))
        reason = f"drain of node {node_name} timed out; {len(blocking)} pods remain: {pods}"
        return Outcome(False, _cut(reason), result)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"
