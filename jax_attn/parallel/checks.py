"""The checks of ``jax_attn.parallel``'s arguments that no other building block has: meshes, their
axis names and the sizes that must divide by an axis."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import AbstractMesh, Mesh

__all__ = ["check_axis", "check_devices", "check_divisible_by_axis", "check_mesh", "check_mesh_fits"]


def check_mesh(mesh: Any) -> None:
    """TypeError unless ``mesh`` is a ``jax.sharding.Mesh`` (or an ``AbstractMesh``: its axes'
    names and sizes are all a check reads)."""
    if not isinstance(mesh, (Mesh, AbstractMesh)):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")


def check_devices(function: str, mesh: Mesh | AbstractMesh) -> None:
    """TypeError for an ``AbstractMesh`` where ``function`` places arrays on the mesh's devices."""
    if isinstance(mesh, AbstractMesh):
        raise TypeError(
            f"{function} places arrays on devices: mesh must be a jax.sharding.Mesh of devices "
            "(jax.make_mesh), got an AbstractMesh"
        )


def check_mesh_fits(mesh: Mesh | AbstractMesh) -> None:
    """ValueError for an ``AbstractMesh`` of more devices than JAX has: XLA would fail at run time
    (``JaxRuntimeError``, no implementation of ``xla.sdy.GlobalToLocalShape``). A ``Mesh`` holds
    its devices, so it always fits."""
    if isinstance(mesh, AbstractMesh) and mesh.size > jax.device_count():
        raise ValueError(
            f"mesh is an AbstractMesh of {mesh.size} devices ({dict(mesh.shape)}), but JAX has "
            f"{jax.device_count()}: pass a mesh of devices (jax.make_mesh) or one that fits"
        )


def check_axis(mesh: Mesh | AbstractMesh, argument: str, axis: Any, *, optional: bool = True) -> None:
    """ValueError naming ``argument`` and the mesh's axes unless ``axis`` is one of them (or None,
    where ``optional``: that kind of sharding is not used)."""
    if (axis is not None or not optional) and axis not in mesh.axis_names:
        raise ValueError(f"{argument} {axis!r} is not an axis of the mesh; its axes are {mesh.axis_names}")


def check_divisible_by_axis(
    what: str, size: int, mesh: Mesh | AbstractMesh, axis: str, *, twice: bool = False
) -> None:
    """ValueError unless ``size`` (described by ``what``: ``"T = 12 (queries.shape[2])"``) splits
    evenly over mesh axis ``axis`` (into two chunks a device where ``twice``)."""
    axis_size = mesh.shape[axis]
    if size % (axis_size * (2 if twice else 1)):
        times = "twice " if twice else ""
        raise ValueError(f"{what} is not divisible by {times}the size {axis_size} of mesh axis {axis!r}")
