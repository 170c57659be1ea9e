"""Typed plan schema (pydantic v2), verl's key names and meanings."""

from rlconf.schema.plan import PlanConfig

__all__ = ["PlanConfig"]
