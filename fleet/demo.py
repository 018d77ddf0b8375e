"""The demo fleet: a believable, deterministic fleet plan (pools, racks, hosts, components, versions,
compatibility rules, services, opt-out windows). seed_demo writes it; tests and the simulator reuse it.

Everything is derived from (seed, pool, rack), so a host gets the same versions however many hosts
are asked for, and a second run finds every row already present.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from decimal import Decimal

from fleet.models import ComponentLayer, DomainKind, WorkloadClass

MIN_HOSTS = 4
MAX_HOSTS = 1_000_000


@dataclass(frozen=True)
class PoolPlan:
    name: str
    workload_class: WorkloadClass
    share: float
    hosts_per_rack: int
    host_prefix: str
    sku: str
    gpu_count: int
    planned_buffer_fraction: Decimal | None
    failure_buffer_fraction: Decimal | None
    planned_buffer_hosts: int | None = None
    failure_buffer_hosts: int | None = None
    services: tuple[str, ...] = ()
    # Job-facing components pinned across the pool: name -> version.
    pinned: tuple[tuple[str, str], ...] = ()
    # Lower-level components: name -> (versions most racks run, versions a few racks slid to).
    sliding: tuple[tuple[str, tuple[str, ...]], ...] = ()
    description: str = ""


@dataclass(frozen=True)
class ComponentPlan:
    name: str
    display_name: str
    layer: str
    needs_reboot: bool
    needs_drain: bool
    versions: tuple[str, ...]


COMPONENTS: tuple[ComponentPlan, ...] = (
    ComponentPlan("bios", "BIOS", ComponentLayer.LOWER_LEVEL, True, True, ("2.14.0", "2.15.1", "2.16.0")),
    ComponentPlan("bmc", "BMC firmware", ComponentLayer.LOWER_LEVEL, False, False, ("1.8.3", "1.9.0", "1.10.2")),
    ComponentPlan("nic-fw", "NIC firmware", ComponentLayer.LOWER_LEVEL, True, True, ("28.39.1002", "28.41.1000")),
    ComponentPlan("kernel", "Linux kernel", ComponentLayer.LOWER_LEVEL, True, True, ("6.1.94", "6.1.112", "6.6.58")),
    ComponentPlan(
        "gpu-driver", "GPU driver", ComponentLayer.LOWER_LEVEL, True, True, ("535.183.01", "550.127.05", "560.35.03")
    ),
    ComponentPlan(
        "cuda-runtime",
        "CUDA runtime (job container)",
        ComponentLayer.JOB_FACING,
        False,
        True,
        ("12.2.2", "12.4.1", "12.6.2"),
    ),
)

# (job-facing component, version, lower component, min, max): lower versions that work with it.
COMPATIBILITY: tuple[tuple[str, str, str, str, str], ...] = (
    ("cuda-runtime", "12.2.2", "gpu-driver", "535.104.05", ""),
    ("cuda-runtime", "12.4.1", "gpu-driver", "550.54.14", ""),
    ("cuda-runtime", "12.6.2", "gpu-driver", "560.28.03", ""),
    ("cuda-runtime", "12.6.2", "kernel", "6.1.0", ""),
)

_COMMON_SLIDING = (
    ("bios", ("2.14.0", "2.15.1")),
    ("bmc", ("1.9.0", "1.10.2")),
    ("nic-fw", ("28.39.1002", "28.41.1000")),
    ("kernel", ("6.1.112", "6.6.58")),
)

POOLS: tuple[PoolPlan, ...] = (
    PoolPlan(
        name="ai-train-east",
        workload_class=WorkloadClass.AI_TRAINING,
        share=0.40,
        hosts_per_rack=16,
        host_prefix="trn",
        sku="gpu-h100-8x",
        gpu_count=8,
        planned_buffer_fraction=Decimal("0.0500"),
        failure_buffer_fraction=Decimal("0.0300"),
        services=("llm-pretrain", "research-finetune"),
        pinned=(("cuda-runtime", "12.4.1"),),
        sliding=(*_COMMON_SLIDING, ("gpu-driver", ("550.127.05", "560.35.03"))),
        description="Large synchronous training jobs; interruptions are expensive.",
    ),
    PoolPlan(
        name="ai-infer-west",
        workload_class=WorkloadClass.AI_INFERENCE,
        share=0.25,
        hosts_per_rack=24,
        host_prefix="inf",
        sku="gpu-l40s-4x",
        gpu_count=4,
        planned_buffer_fraction=Decimal("0.0800"),
        failure_buffer_fraction=Decimal("0.0400"),
        services=("ranking-inference", "genai-serving"),
        pinned=(("cuda-runtime", "12.2.2"),),
        sliding=(*_COMMON_SLIDING, ("gpu-driver", ("535.183.01", "550.127.05"))),
        description="Online inference; latency-sensitive, stateless replicas.",
    ),
    PoolPlan(
        name="web-central",
        workload_class=WorkloadClass.WEB,
        share=0.20,
        hosts_per_rack=40,
        host_prefix="web",
        sku="cpu-epyc-2s",
        gpu_count=0,
        planned_buffer_fraction=Decimal("0.1000"),
        failure_buffer_fraction=Decimal("0.0500"),
        services=("web-frontend", "web-api"),
        sliding=_COMMON_SLIDING,
        description="Stateless web tier.",
    ),
    PoolPlan(
        name="storage-north",
        workload_class=WorkloadClass.STORAGE,
        share=0.15,
        hosts_per_rack=20,
        host_prefix="sto",
        sku="storage-jbod-60",
        gpu_count=0,
        planned_buffer_fraction=None,
        failure_buffer_fraction=Decimal("0.0200"),
        planned_buffer_hosts=2,
        services=("blob-store",),
        sliding=_COMMON_SLIDING,
        description="Replicated blob storage; drains re-replicate data, so one rack at a time.",
    ),
)

SERVICES: dict[str, str] = {
    "llm-pretrain": "LLM pre-training",
    "research-finetune": "Research fine-tuning",
    "ranking-inference": "Ranking inference",
    "genai-serving": "GenAI serving",
    "web-frontend": "Web front end",
    "web-api": "Public API",
    "blob-store": "Blob store",
}

# (service, starts in hours from the seeding moment, lasts hours, reason)
OPTOUT_WINDOWS: tuple[tuple[str, int, int, str], ...] = (
    ("llm-pretrain", 6, 8, "[demo] checkpoint of the flagship run; avoid draining until it is saved"),
    ("genai-serving", 30, 24, "[demo] product launch; keep serving capacity steady"),
    ("blob-store", 48, 6, "[demo] re-replication after a disk batch swap"),
)


def hosts_per_pool(total_hosts: int) -> dict[str, int]:
    """Split total_hosts over the pools by share (largest remainder), at least one host each."""
    if not MIN_HOSTS <= total_hosts <= MAX_HOSTS:
        raise ValueError(f"--hosts must be between {MIN_HOSTS} and {MAX_HOSTS:,}, not {total_hosts:,}")
    exact = {plan.name: plan.share * total_hosts for plan in POOLS}
    counts = {name: max(1, math.floor(value)) for name, value in exact.items()}
    leftover = total_hosts - sum(counts.values())
    by_remainder = sorted(POOLS, key=lambda plan: exact[plan.name] - math.floor(exact[plan.name]), reverse=True)
    index = 0
    while leftover > 0:
        counts[by_remainder[index % len(POOLS)].name] += 1
        leftover -= 1
        index += 1
    while leftover < 0:  # only when the one-host minimum pushed us over
        biggest = max(counts, key=counts.__getitem__)
        counts[biggest] -= 1
        leftover += 1
    return counts


def rack_name(number: int) -> str:
    return f"rack-{number:04d}"


def hostname(plan: PoolPlan, rack: int, slot: int) -> str:
    return f"{plan.host_prefix}-r{rack:04d}-h{slot:02d}"


def rack_versions(plan: PoolPlan, rack: int, seed: int) -> dict[str, str]:
    """The versions every host of one rack runs: pinned ones, plus where each sliding upgrade got to.

    Racks are where sliding upgrades stop, so a rack is uniform and about a fifth of the racks have
    moved on to the newer version of each lower-level component.
    """
    rng = random.Random(f"{seed}:{plan.name}:{rack}")
    versions = dict(plan.pinned)
    for component, choices in plan.sliding:
        versions[component] = choices[-1] if rng.random() < 0.2 else choices[0]
    return versions


def rack_service(plan: PoolPlan, rack: int) -> str:
    return plan.services[(rack - 1) % len(plan.services)]


def running_jobs(plan: PoolPlan) -> int:
    """Jobs a drain of one host interrupts: one big job on training hosts, several replicas elsewhere."""
    return {WorkloadClass.AI_TRAINING: 1, WorkloadClass.AI_INFERENCE: 3}.get(plan.workload_class, 8)


DOMAIN_KIND = DomainKind.RACK
