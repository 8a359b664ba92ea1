"""The family registry: every family (bert/families/<name>.py, `FAMILY = Family(...)`), found once.

A family module joins by defining `FAMILY`, an instance of `bert.families.base.Family`; nothing else in
bertserve lists families. They stand in (order, name) order. An unsupported model_type is `UnsupportedFamily`,
one line naming the supported ones.

torch-free: serving reads artifact configs without torch.
"""

from __future__ import annotations

from pathlib import Path

from bert.discovery import declarations

from .base import Family, UnsupportedFamily

_NOT_FAMILIES = {"base", "registry"}


def _discover() -> tuple[Family, ...]:
    return tuple(declarations(__package__, Path(__file__).parent, "FAMILY", Family, _NOT_FAMILIES))


def _by_model_type(families: tuple[Family, ...]) -> dict[str, Family]:
    table: dict[str, Family] = {}
    for family in families:
        for model_type in family.model_types:
            if model_type in table:
                raise ValueError(
                    f"model_type {model_type!r} is in families {table[model_type].name!r} and {family.name!r}"
                )
            table[model_type] = family
    return table


FAMILIES: tuple[Family, ...] = _discover()
BY_MODEL_TYPE: dict[str, Family] = _by_model_type(FAMILIES)


def family_of(model_type: str) -> Family:
    """The family covering `model_type`, or UnsupportedFamily naming it and the supported ones."""
    try:
        return BY_MODEL_TYPE[model_type]
    except (KeyError, TypeError):
        raise UnsupportedFamily(
            f"model_type {model_type!r:.60} is not supported; the supported model_types are {', '.join(BY_MODEL_TYPE)}"
        ) from None
