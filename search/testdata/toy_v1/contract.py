"""Numerical contract of the toy implementation (coupled constants, read by every path)."""

# Keys are reduced in chunks of TOY_CHUNK absolute positions; chunk partial sums are merged left to
# right. Both paths (full sequence, step) use the same chunks, so their outputs agree bit for bit.
TOY_CHUNK = 16

COUPLED = {
    "TOY_CHUNK": (8, 16, 32),
}
