import os
if os.environ.get("HOLD_ON_CPU"):
    import appliance  # noqa
    from appliance.engine import step
    step.HOLD = True
