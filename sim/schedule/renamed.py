"""Old spellings of renamed keywords: still accepted, with one DeprecationWarning a call.

`make_schedule(name, stages=, micro=)` became `devices=`, `micro_batches=`, and
`Schedule(..., micro=)` became `micro_batches=`: `stages` is the model stages of a
`Schedule` and `micro` a micro-batch's index on an `Action` (docs/schedules.md, "Names").
"""
from __future__ import annotations

import warnings


def take_renamed(func: str, given: dict, renames: dict[str, str], stacklevel: int = 3) -> None:
    """Move each old keyword of `renames` (old -> new) in `given` to its new name, with one
    DeprecationWarning naming the new keywords; TypeError where both spellings are given."""
    old = [name for name in renames if name in given]
    if not old:
        return
    for name in old:
        new = renames[name]
        if given.get(new) is not None:
            raise TypeError(f"{func}() got both {new}= and its old spelling {name}=; give {new}= only")
        given[new] = given.pop(name)
    said = ", ".join(f"{name}= is now {renames[name]}=" for name in old)
    warnings.warn(f"{func}(): {said}", DeprecationWarning, stacklevel=stacklevel)


def warn_renamed_attribute(owner: str, old: str, new: str, stacklevel: int = 3) -> None:
    """One DeprecationWarning: `owner.old` is now `owner.new`."""
    warnings.warn(f"{owner}.{old} is deprecated: use {owner}.{new}", DeprecationWarning, stacklevel=stacklevel)


def take_sizes(func: str, devices: int | None, micro_batches: int | None, options: dict) -> tuple:
    """(devices, micro_batches) of a call that takes a schedule's sizes, taking the old
    keywords `stages=` and `micro=` out of `options` (one DeprecationWarning at the caller of
    `func`)."""
    sizes = {"devices": devices, "micro_batches": micro_batches}
    sizes.update((old, options.pop(old)) for old in ("stages", "micro") if old in options)
    take_renamed(func, sizes, {"stages": "devices", "micro": "micro_batches"}, stacklevel=4)
    return sizes["devices"], sizes["micro_batches"]
