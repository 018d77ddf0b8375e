from opsplanner.models.advisor import AdvisorRun, AdvisorRunState
from opsplanner.models.approvals import Approval, ApprovalKind, ApprovalState
from opsplanner.models.events import Event
from opsplanner.models.idempotency import IdempotencyRecord
from opsplanner.models.leases import Lease
from opsplanner.models.operations import (
    ACTIVE_TASK_STATES,
    DRAIN_READ_STATES,
    MAX_PRIORITY,
    OPEN_TASK_STATES,
    OPERATOR_KINDS,
    REPAIR_PRIORITY,
    TERMINAL_TASK_STATES,
    Adapter,
    HostTask,
    Operation,
    OperationKind,
    OperationSource,
    OperationState,
    TaskState,
    WaitingCode,
)
from opsplanner.models.simulator import SimulatorProfile
from opsplanner.models.work_items import (
    FINISHED_WORK_STATES,
    VERIFY_CLASSES,
    VerifyClass,
    WorkItem,
    WorkKind,
    WorkState,
)
from opsplanner.models.workers import WorkerHeartbeat

__all__ = [
    "ACTIVE_TASK_STATES",
    "DRAIN_READ_STATES",
    "FINISHED_WORK_STATES",
    "MAX_PRIORITY",
    "OPEN_TASK_STATES",
    "OPERATOR_KINDS",
    "REPAIR_PRIORITY",
    "TERMINAL_TASK_STATES",
    "VERIFY_CLASSES",
    "Adapter",
    "AdvisorRun",
    "AdvisorRunState",
    "Approval",
    "ApprovalKind",
    "ApprovalState",
    "Event",
    "HostTask",
    "IdempotencyRecord",
    "Lease",
    "Operation",
    "OperationKind",
    "OperationSource",
    "OperationState",
    "SimulatorProfile",
    "TaskState",
    "VerifyClass",
    "WaitingCode",
    "WorkItem",
    "WorkKind",
    "WorkState",
    "WorkerHeartbeat",
]
