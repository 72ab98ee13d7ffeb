"""The world model's commands: one typed model per change, and one method per command.

Every change to a run's tree is one of the commands below. The driver builds it, the world model
applies it (`WorldModelState`, in this process and inside the Ray actor alike), and the run's log
keeps it (`events.WmCall`), so a resumed run and every reader replay the same commands through the
same pure functions. A command knows the type of what it returns (`Command[R]`), so `run(command)`
is typed for each one without a table of names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Annotated, Generic, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_serializer

from ksearch_ray.worldmodel.ops import ApplyReport, EditOp

R = TypeVar("R")

RawOp = dict[str, JsonValue]
"""An op as a planner wrote it, kept as written when it is not a valid op (`apply_ops` says why, per op)."""

LeaseIds = list[str]
"""Node ids: those leased (`SelectAndLease`), those whose lease was lost (`Renew`, `Release`) or expired."""


class Command(BaseModel, Generic[R]):
    """A change of the world model whose result is an `R`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call: str
    """The command's name in the run's log (and in the world model's record)."""


class ApplyOps(Command[ApplyReport]):
    """Apply a batch of edit ops (`ops.apply_ops`): the system's own, or a planner's reply."""

    call: Literal["apply"] = "apply"
    ops: Sequence[Annotated[EditOp | RawOp, Field(union_mode="left_to_right")]]
    system: bool = Field(default=True, description="False: a planner's batch, which may not use the system ops.")
    base_version: int | None = Field(default=None, description="The tree version a planner's batch was written against.")
    max_new: int | None = Field(default=None, description="How many new actions the batch may add; None: no limit.")

    @field_serializer("ops")
    def _ops_as_written(self, ops: Sequence[EditOp | RawOp]) -> list[RawOp]:
        # Only the fields that were given: a replayed op fills the same defaults, and says so again in its report.
        return [op if isinstance(op, dict) else {"op": op.op, **op.model_dump(mode="json", exclude_unset=True)}
                for op in ops]


class SelectAndLease(Command[LeaseIds]):
    """Select up to `k` frontier actions and lease them to `holder`; returns the ids leased."""

    call: Literal["select_and_lease"] = "select_and_lease"
    k: int
    holder: str
    now: float
    ttl: float
    max_difficulty: int
    relax_at: float | None = Field(description="The best speedup from which harder actions may start; None: never.")


class Renew(Command[LeaseIds]):
    """Extend `holder`'s leases on `ids`; returns those it no longer held (expired, perhaps another's now)."""

    call: Literal["renew"] = "renew"
    ids: list[str]
    holder: str
    now: float
    ttl: float


class Release(Command[LeaseIds]):
    """Give `holder`'s leases on `ids` back to the frontier; returns those it no longer held."""

    call: Literal["release"] = "release"
    ids: list[str]
    holder: str


class Expire(Command[LeaseIds]):
    """End every lease that expired by `now`; returns their node ids."""

    call: Literal["expire"] = "expire"
    now: float


AnyCommand = ApplyOps | SelectAndLease | Renew | Release | Expire
WmCommand = Annotated[AnyCommand, Field(discriminator="call")]
"""Any command, as the run's log holds it (tagged by `call`)."""


def logged(command: Command[R]) -> AnyCommand:
    """`command` as one of the commands the run's log knows (a new command must be added to `AnyCommand`)."""
    if not isinstance(command, ApplyOps | SelectAndLease | Renew | Release | Expire):
        raise TypeError(f"{type(command).__name__} is not a command of the run's log")
    return command


class WorldModelApi(ABC):
    """One method per command, and `run`, which applies any command through them."""

    @abstractmethod
    def apply_ops(self, ops: Sequence[EditOp | RawOp], *, system: bool = True, base_version: int | None = None,
                  max_new: int | None = None) -> ApplyReport: ...

    @abstractmethod
    def select_and_lease(self, k: int, holder: str, now: float, ttl: float, *, max_difficulty: int,
                         relax_at: float | None) -> LeaseIds: ...

    @abstractmethod
    def renew(self, ids: Sequence[str], holder: str, now: float, ttl: float) -> LeaseIds: ...

    @abstractmethod
    def release(self, ids: Sequence[str], holder: str) -> LeaseIds: ...

    @abstractmethod
    def expire(self, now: float) -> LeaseIds: ...

    def run(self, command: Command[R]) -> R:
        """Apply one command; returns what its method returns."""
        result: ApplyReport | LeaseIds
        if isinstance(command, ApplyOps):
            result = self.apply_ops(command.ops, system=command.system, base_version=command.base_version,
                                    max_new=command.max_new)
        elif isinstance(command, SelectAndLease):
            result = self.select_and_lease(command.k, command.holder, command.now, command.ttl,
                                           max_difficulty=command.max_difficulty, relax_at=command.relax_at)
        elif isinstance(command, Renew):
            result = self.renew(command.ids, command.holder, command.now, command.ttl)
        elif isinstance(command, Release):
            result = self.release(command.ids, command.holder)
        elif isinstance(command, Expire):
            result = self.expire(command.now)
        else:
            raise TypeError(f"not a world-model command: {type(command).__name__}")
        return cast(R, result)
