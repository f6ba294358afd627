"""Runtime: kernel implementation loader, Triton-interpreter set-up, native host launch path.

``loader`` finds, hash-checks and loads implementations; ``interp`` switches Triton's interpreter on
when no GPU is present; ``native`` launches Triton's compiled kernels from C for the hot forward calls.
"""
