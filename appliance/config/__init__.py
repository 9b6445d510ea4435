"""Hydra side of the appliance: typed schemas and where conf/ and profiles/ live."""
