# Experiment: the SSD writer writes only while the engine is quiet (never forced by the
# queue's fill or an entry's age); a full queue skips new entries.
import appliance  # noqa: F401
from appliance.engine import ssd_tier

ssd_tier.may_write = lambda now, last_step, queued_at, backlog, closing: (
    closing or now - last_step >= ssd_tier.QUIET_S)
