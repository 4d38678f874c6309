"""Graph helpers for stage bodies: stage models on disk, partitioning, the ONNX frontend, sources."""

from edgebuild.conformance.classify import EMPTY_TENSORS
from edgebuild.graph.declined import declined_reason, mark_declined
from edgebuild.graph.frontend import DATA_FILE, MODEL_FILE, OnnxFrontend
from edgebuild.graph.fused_reference import REFERENCE_OPS
from edgebuild.graph.int_ranges import int_range_reason
from edgebuild.graph.partition import HandOff, Segment, estimate_flops, handoffs, partition, segment_model
from edgebuild.graph.quantized.qoperator import MS_DOMAIN, REWRITES, rewrite_graph
from edgebuild.graph.resolvers import check_digest, resolve_pypi
from edgebuild.graph.weight_files import copying, load_stage_model

__all__ = [
    "load_stage_model", "copying", "MODEL_FILE", "DATA_FILE", "OnnxFrontend",
    "partition", "Segment", "HandOff", "handoffs", "segment_model", "estimate_flops",
    "MS_DOMAIN", "REWRITES", "rewrite_graph", "REFERENCE_OPS", "check_digest", "resolve_pypi",
    "EMPTY_TENSORS", "mark_declined", "declined_reason", "int_range_reason",
]
