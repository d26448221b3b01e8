"""The interpreter's thread switch interval for a serving process.

Decode workers hand the GIL back while ONNX Runtime runs a step (or an encoder call, or a large
copy) and need it again for the search's bookkeeping afterwards; the event loop holds it while
gRPC's callbacks run. A thread that wants the GIL waits for the holder to release it, and asks it
to only after `sys.getswitchinterval()`: 5 ms by default, longer than a decoder step. Under load,
decode workers then sat idle for up to that long after most steps (py-spy: a sixth of their time
spent waiting to get the GIL back; about 0.35 of the 2 cores idle at c64 while requests waited).
A shorter interval bounds that wait; the holder gives the GIL up sooner and gets it back once
the decode worker's bookkeeping (about 0.1 ms) is done or ONNX Runtime runs again.
docs/performance.md has the measurements.
"""

from __future__ import annotations

import sys


def set_switch_interval(ms: float) -> None:
    """Set the switch interval to `ms` milliseconds."""
    sys.setswitchinterval(ms / 1000.0)
