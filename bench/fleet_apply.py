"""Applying a 100,000-host fleet file on PostgreSQL (target: under 60 s), the no-change re-apply
(target: under 15 s), and the peak memory of either (target: under 1 GiB). The file is JSON (YAML
parsing alone takes several seconds at this size); the re-apply is also timed from YAML."""

from __future__ import annotations

import json
import resource
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.common import Figure, manage, scratch_database_url

HOSTS = 100_000
POOLS = (("ai-train", "ai_training", 16, "gpu-h100-8x", 8), ("ai-infer", "ai_inference", 24, "gpu-l40s-4x", 4),
         ("web", "web", 40, "cpu-epyc-2s", 0), ("storage", "storage", 20, "storage-jbod-60", 0))  # fmt: skip


def fleet_document(hosts: int) -> dict[str, Any]:
    """Four pools of racks, every host labelled and placed on its pool's service."""
    per_pool = hosts // len(POOLS)
    pools, host_rows, services = [], [], []
    for name, workload, per_rack, sku, gpus in POOLS:
        racks = -(-per_pool // per_rack)
        domains = [{"name": f"rack-{r:04d}", "kind": "rack", "position": r} for r in range(1, racks + 1)]
        pools.append({"name": name, "workload_class": workload, "planned_buffer": 0.05, "failure_buffer": 0.03,
                      "domains": domains})  # fmt: skip
        names = []
        for index in range(per_pool):
            rack, slot = index // per_rack + 1, index % per_rack + 1
            hostname = f"{name}-r{rack:04d}-h{slot:02d}"
            labels = {"row": f"row-{rack // 10:03d}", "switch": f"leaf-{rack:04d}", "slurm_node": f"{name}{index:06d}"}
            host_rows.append({"hostname": hostname, "pool": name, "domain": f"rack-{rack:04d}", "sku": sku,
                              "gpu_count": gpus, "labels": labels})  # fmt: skip
            names.append(hostname)
        services.append({"name": f"{name}-jobs", "display_name": f"{name} jobs", "placements": names})
    components = [
        {"name": "cuda-runtime", "layer": "job_facing", "versions": ["12.4.1", "12.6.2"]},
        {"name": "gpu-driver", "layer": "lower_level", "versions": ["550.127.05", "560.35.03"]},
        {"name": "bios", "layer": "lower_level", "versions": ["2.14.0", "2.16.0"]},
    ]
    rules = [{"job_facing": "cuda-runtime", "version": "12.6.2", "lower": "gpu-driver", "min": "560.28.03"}]
    return {"version": 1, "pools": pools, "components": components, "compatibility": rules, "hosts": host_rows,
            "services": services}  # fmt: skip


def run(seconds: float | None = None, hosts: int = HOSTS) -> list[Figure]:
    url = scratch_database_url("bench_fleet_apply")
    manage("migrate", "-v0", database_url=url)
    with tempfile.TemporaryDirectory() as folder:
        document = fleet_document(hosts)
        as_json, as_yaml = Path(folder) / "fleet.json", Path(folder) / "fleet.yaml"
        as_json.write_text(json.dumps(document))
        as_yaml.write_text(yaml.dump(document, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False))
        del document
        first, result = manage("fleet_apply", str(as_json), database_url=url)
        if "Applied" not in result.stdout:
            raise SystemExit(f"the first apply did not apply:\n{result.stdout[-2000:]}")
        again, result = manage("fleet_apply", str(as_json), database_url=url)
        again_yaml, result_yaml = manage("fleet_apply", str(as_yaml), database_url=url)
        for output in (result.stdout, result_yaml.stdout):
            if "Plan: no changes" not in output:
                raise SystemExit(f"the re-apply changed something:\n{output[-2000:]}")
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    how = f"python -m bench fleet_apply (fresh database, a {hosts:,}-host fleet file as JSON, own process)"
    return [
        Figure("fleet_apply_100k_s", round(first, 1), "s", how),
        Figure("fleet_reapply_100k_s", round(again, 1), "s", how + "; the same file again, which changes nothing"),
        Figure("fleet_reapply_100k_yaml_s", round(again_yaml, 1), "s", how + "; the same again from the YAML file"),
        Figure("fleet_apply_100k_peak_mib", round(peak_mib), "MiB", how + "; peak resident memory of any run"),
    ]
