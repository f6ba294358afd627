"""The import-only ``ray`` stand-in used to run AReaL's FSDP engine on the GPU machine
(``devenv/areal_gpu_stubs``): imports work, nothing runs silently."""

from __future__ import annotations

import os
import subprocess
import sys

from areal_tik_plugin.runtime.source_checkout import devenv_dir

STUBS = devenv_dir("areal_gpu_stubs", required=True)

CHILD = r"""
import ray
assert ray.__file__.startswith(STUBS), ray.__file__
import ray.exceptions
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from ray.runtime_env import RuntimeEnv
assert ray.is_initialized() is False
assert not isinstance(object(), ray.ObjectRef)

@ray.remote
class Store:
    pass

assert Store.__name__ == "Store"
annotation = ray.actor.ActorHandle  # used in dataclass annotations
for call in (lambda: ray.get([]), lambda: placement_group([]), lambda: ray.init()):
    try:
        call()
    except RuntimeError as e:
        assert "ray is not installed here" in str(e), e
    else:
        raise AssertionError("a ray stub call must raise")
try:
    raise ray.exceptions.RayActorError
except RuntimeError:
    pass  # the placeholder exception cannot even be built
print("RAY-STUB-OK")
"""


def test_ray_stub_imports_and_raises():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([STUBS, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", f"STUBS = {STUBS!r}\n" + CHILD], env=env, capture_output=True,
                       text=True, timeout=60)
    assert "RAY-STUB-OK" in r.stdout, r.stdout + r.stderr
