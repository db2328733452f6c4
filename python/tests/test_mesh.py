"""substrax.mesh.DeviceMeshManager on four CPU devices of one process.

Meshes whose model groups would span processes are refused; that needs devices of two processes
and is tested in test_spmd.py's two-process test.
"""

from __future__ import annotations

import conftest_spmd

conftest_spmd.require_jax()

import jax  # noqa: E402
import pytest  # noqa: E402

from substrax.mesh import DeviceMeshManager, MeshInfo  # noqa: E402


def ids(mesh: jax.sharding.Mesh) -> list:
    return [[d.id for d in row] for row in mesh.devices.reshape(-1, mesh.devices.shape[-1])]


def test_data_parallel_mesh_takes_every_device_in_order() -> None:
    mesh = DeviceMeshManager.create_data_parallel_mesh()
    assert mesh.axis_names == ("data",)
    assert dict(mesh.shape) == {"data": 4}
    assert ids(mesh) == [[0, 1, 2, 3]]


def test_data_parallel_mesh_of_given_devices() -> None:
    devices = jax.devices()
    mesh = DeviceMeshManager.create_data_parallel_mesh([devices[3], devices[1]])
    assert ids(mesh) == [[1, 3]]


def test_data_parallel_mesh_refuses_no_devices_and_repeats() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        DeviceMeshManager.create_data_parallel_mesh([])
    d = jax.devices()[0]
    with pytest.raises(ValueError, match=r"devices \[0\] are given more than once"):
        DeviceMeshManager.create_data_parallel_mesh([d, d])


def test_model_parallel_mesh() -> None:
    mesh = DeviceMeshManager.create_model_parallel_mesh(num_devices=2)
    assert mesh.axis_names == ("model",)
    assert ids(mesh) == [[0, 1]]
    assert ids(DeviceMeshManager.create_model_parallel_mesh(num_devices=4)) == [[0, 1, 2, 3]]


def test_model_parallel_mesh_refusals() -> None:
    with pytest.raises(ValueError, match="num_devices must be >= 1"):
        DeviceMeshManager.create_model_parallel_mesh(num_devices=0)
    with pytest.raises(ValueError, match="of 5 devices, but only 4 are available"):
        DeviceMeshManager.create_model_parallel_mesh(num_devices=5)


def test_hybrid_mesh_groups_consecutive_devices_on_the_model_axis() -> None:
    mesh = DeviceMeshManager.create_hybrid_mesh(data_parallel_size=2, model_parallel_size=2)
    assert mesh.axis_names == ("data", "model")
    assert dict(mesh.shape) == {"data": 2, "model": 2}
    assert ids(mesh) == [[0, 1], [2, 3]]
    assert ids(DeviceMeshManager.create_hybrid_mesh(1, 4)) == [[0, 1, 2, 3]]
    assert ids(DeviceMeshManager.create_hybrid_mesh(4, 1)) == [[0], [1], [2], [3]]


@pytest.mark.parametrize(
    ("dp", "mp", "message"),
    [
        (2, 4, r"data_parallel_size x model_parallel_size = 8, but there are 4 devices"),
        (1, 2, r"= 2, but there are 4 devices \(process 0: 4\)"),
        (0, 4, r"must be >= 1"),
        (4, -1, r"must be >= 1"),
    ],
)
def test_hybrid_mesh_refuses_sizes_that_do_not_fit(dp: int, mp: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeviceMeshManager.create_hybrid_mesh(data_parallel_size=dp, model_parallel_size=mp)


def test_mesh_info_describes_the_grid() -> None:
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 2)
    info = DeviceMeshManager.get_mesh_info(mesh)
    assert isinstance(info, MeshInfo)
    assert info.axis_names == ("data", "model")
    assert info.shape == (2, 2)
    assert info.device_count == 4
    assert info.process_indices == (0,)
    assert [d.id for d in info.devices] == [0, 1, 2, 3]
    assert str(info).splitlines() == [
        "mesh (data=2, model=2): 4 devices in 1 process (0)",
        "          model=0    model=1",
        "  data=0  d0 p0/cpu  d1 p0/cpu",
        "  data=1  d2 p0/cpu  d3 p0/cpu",
    ]
    one_d = str(DeviceMeshManager.get_mesh_info(DeviceMeshManager.create_data_parallel_mesh()))
    assert one_d.splitlines()[0] == "mesh (data=4): 4 devices in 1 process (0)"
    assert one_d.splitlines()[2].split() == ["d0", "p0/cpu", "d1", "p0/cpu", "d2", "p0/cpu",
                                             "d3", "p0/cpu"]


def test_manager_has_static_methods_only() -> None:
    with pytest.raises(TypeError, match="static methods only"):
        DeviceMeshManager()
