"""Numpy reference kernels shared by every executor.

The fused-op reference (:mod:`edgebuild.graph.fused_reference`), the MIL interpreter and the
MPSGraph executor each evaluate ops in numpy; where they compute the same function they call
the one kernel here, so a fix (overflow, NaN, memory) reaches all of them at once.

Conventions: numpy only; a kernel returns the input's floating-point dtype (integers become
float64) unless it says otherwise; elementwise kernels that need temporaries work a slice at a
time (:mod:`edgebuild.reference.slices`), so their peak memory does not grow with the tensor.
"""
