# CUDA's shape policy on CPU, for a whole script: on_cuda() read True where modules decide
# their shapes at import (speculate.shapes and what reads it; kv.native's GRID_TRIM).
import runpy, sys
import appliance  # noqa
import appliance.engine.kv.native as native
native.on_cuda = lambda: True
native.GRID_TRIM = True
import appliance.engine.speculate.shapes as shapes
assert shapes.WHOLE_BUFFER
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
