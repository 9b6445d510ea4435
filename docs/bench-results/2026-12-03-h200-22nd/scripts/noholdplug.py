import appliance.engine.step as _s
_s.HOLD = False
