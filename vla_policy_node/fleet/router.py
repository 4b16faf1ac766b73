"""Robot-affine routing for the policy replicas, as a Ray Serve request router.

Ray Serve's request-router API (``ray.serve.request_router.RequestRouter``, alpha in Ray 2.60; its
``PowerOfTwoChoicesRequestRouter`` and Ray Serve LLM's ``PrefixCacheAffinityRouter`` are built on it) asks
``choose_replicas`` for ranks of replicas, best first; Serve then sends the request to the first rank's replica
whose queue is not full (probing queue lengths it does not know) and goes down the ranks otherwise. Here each
rank is one replica, in the order fleet/affinity.AffinityTable gives for the request's robot (the first argument
of ``PolicyReplica.infer``): the robot's replica, unless the load guard spills this request, then the others by
queue length. A replica that dies leaves the candidates, and its robots fail over on their next request.

Model multiplexing keyed on the robot would also be affine, but ``@serve.batch`` splits batches by multiplexed
id, which would undo the cross-robot batching each replica does.
"""
from __future__ import annotations

from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .affinity import DEFAULT_IDLE_SEC, DEFAULT_LOAD_GUARD, AffinityTable


class RobotAffinityRouter(RequestRouter):
    """``request_router_kwargs``: ``load_guard`` (requests of queue imbalance before a request spills) and
    ``idle_sec`` (a robot unseen this long no longer counts)."""

    def initialize_state(self, load_guard: int = DEFAULT_LOAD_GUARD, idle_sec: float = DEFAULT_IDLE_SEC,
                         **_: object) -> None:
        self.table = AffinityTable(load_guard=load_guard, idle_sec=idle_sec)

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        robot = robot_of(pending_request)
        if robot is None or not candidate_replicas:     # not a robot's request (or nothing to choose from)
            return [candidate_replicas]
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        cache = self.replica_queue_len_cache
        lengths = {unique_id: cache.get(replica.replica_id) for unique_id, replica in by_id.items()}
        return [[by_id[unique_id]] for unique_id in self.table.rank(robot, list(by_id), lengths)]


def robot_of(pending_request: Optional[PendingRequest]) -> Optional[str]:
    """The robot a request is for: ``PolicyReplica.infer(robot, frame)``'s first argument."""
    if pending_request is None or not pending_request.args:
        return None
    robot = pending_request.args[0]
    return robot if isinstance(robot, str) else None
