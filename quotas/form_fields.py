"""Form fields of quota sizes as people type and read them, for the admin site and the portal's quota editor alike:
GPU memory in GiB (stored in MiB: 320 GiB is 327,680 MiB; a fraction of a GiB rounds to the nearest MiB) and GPU
counts without trailing zeros ("4", not "4.000")."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django import forms

MIB_PER_GIB = 1024


def plain(value: Decimal | None) -> Decimal | None:
    """Without trailing zeros and never in exponent form (normalize() makes 320 "3.2E+2")."""
    return None if value is None else Decimal(f"{value.normalize():f}")


def gib_of(mib: int | None) -> Decimal | None:
    return None if mib is None else plain(Decimal(mib) / MIB_PER_GIB)


def mib_of(gib: Decimal | None) -> int | None:
    return None if gib is None else int((gib * MIB_PER_GIB).to_integral_value(ROUND_HALF_UP))


class PlainDecimalField(forms.DecimalField):
    """A decimal shown as typed: 4 GPUs read "4", a weight of 2 "2" (the model's "4.000" is its storage)."""

    def prepare_value(self, value: Any) -> Any:
        return plain(value) if isinstance(value, Decimal) else value


class GpuMemoryGiBField(forms.DecimalField):
    """GPU memory typed and shown in GiB, cleaned to the MiB a quota stores."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("decimal_places", 3)
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        # From the instance: MiB (an int); from a form sent back with an error: the GiB as typed.
        return gib_of(value) if isinstance(value, int) else value

    def clean(self, value: Any) -> int | None:
        return mib_of(super().clean(value))

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            typed = mib_of(self.to_python(data))
        except forms.ValidationError:
            return True
        return typed != (None if initial in (None, "") else int(initial))
