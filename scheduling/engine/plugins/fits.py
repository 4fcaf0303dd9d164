"""Filter: the node is ready and has the cards, slices, topology, CPU and host memory the request needs."""

from __future__ import annotations

from scheduling.engine.framework import CycleContext
from scheduling.engine.reasons import explain_node
from scheduling.engine.resources import DEFAULT_TIMESLICE_FACTOR, node_fits
from scheduling.engine.types import Job, Node, Status

NAME = "fits"


class Fits:
    """The engine's own node-fit rule as a filter. The node index applies that rule to every query natively (it
    cannot place what does not fit), so `NODE_FIT` tells the engine not to call this filter a second time;
    listing it in a profile is harmless, and it is what a reason sentence or a test calls to ask one node."""

    NAME = NAME
    CACHEABLE = True  # depends only on the request and the node's shape
    NODE_FIT = True

    def filter(self, ctx: CycleContext, job: Job, node: Node) -> Status | None:
        factor = ctx.param("timeslice_oversubscription", DEFAULT_TIMESLICE_FACTOR)
        if node_fits(job.request, node, factor):
            return None
        return explain_node(job.request, node, factor)
