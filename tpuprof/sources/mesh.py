"""A device mesh in MaxText's terms (`--mesh fsdp=-1,tensor=4`) over a slice's compile-only devices: for the
LLM step (tpuprof.sources.llm) and for factories that take a `mesh` parameter."""

from __future__ import annotations

from tpuprof.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor", "expert")


def parse_mesh(text: str | None, devices: int) -> dict[str, int]:
    """`fsdp=-1,tensor=4` -> {"data": 1, "fsdp": devices/4, "tensor": 4, "expert": 1}; default: all FSDP."""
    sizes: dict[str, int] = {}
    for part in (text or "fsdp=-1").split(","):
        if not part.strip():
            continue
        axis, sep, value = part.partition("=")
        axis = axis.strip()
        if not sep or axis not in MESH_AXES:
            raise UserError(f"--mesh {text!r}: give axis=size pairs with axes {', '.join(MESH_AXES)}, "
                            "e.g. fsdp=-1,tensor=4.")
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size != -1 and size < 1:
            raise UserError(f"--mesh {text!r}: {axis} must be a positive size or -1 (the rest of the devices).")
        sizes[axis] = size
    rest = [axis for axis, size in sizes.items() if size == -1]
    if len(rest) > 1:
        raise UserError(f"--mesh {text!r}: only one axis can be -1.")
    known = 1
    for size in sizes.values():
        known *= size if size > 0 else 1
    if rest:
        if devices % known:
            raise UserError(f"--mesh {text!r}: the other axes ({known}) do not divide the slice's {devices} devices.")
        sizes[rest[0]] = devices // known
    product = 1
    for size in sizes.values():
        product *= size
    if product != devices:
        raise UserError(f"--mesh {text!r} has {product} devices, the slice has {devices}: the axes' product must "
                        "equal the device count (use -1 for the rest).")
    return {axis: sizes.get(axis, 1) for axis in MESH_AXES}


def make_mesh(devices, sizes: dict[str, int]):
    """A Mesh over the slice's devices with MaxText's axis names, laid out along the torus where possible."""
    import numpy as np
    from jax.sharding import Mesh

    shape = tuple(sizes[axis] for axis in MESH_AXES)
    try:
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices=list(devices))
    except Exception:  # noqa: BLE001 - a shape the topology-aware layout does not support: plain order
        grid = np.array(list(devices)).reshape(shape)
    return Mesh(grid, MESH_AXES)
