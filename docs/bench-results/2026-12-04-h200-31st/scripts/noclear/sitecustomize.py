"""devrun only: with APPLIANCE_NO_SSD_CLEAR=1 the engine never clears MLX's buffer cache
after an SSD write (`SsdTier.step_started`). On CUDA that clear syncs the device (its
buffers are freed), once a write: the 31st session's profile of the 8B agents run put 4.3%
of the engine loop's samples there. Without it, a buffer the writer read on the host may
be handed to the engine and paged back to the device. Which costs more is what the A/B
in next-session.sh 1 measures."""
import os

if os.environ.get("APPLIANCE_NO_SSD_CLEAR"):
    import math

    from appliance.engine import ssd_tier

    def step_started(self) -> None:
        self._last_step, self._clear_wanted = math.inf, False

    ssd_tier.SsdTier.step_started = step_started
