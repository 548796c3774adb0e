"""pipekit.samplers: TorchGeo 0.8's torchgeo.samplers names, the samplers of pipekit.geo."""

from __future__ import annotations

import pipekit.geo
import pipekit.samplers

#: ``torchgeo.samplers.__all__`` in TorchGeo 0.8.1
TORCHGEO_SAMPLERS = [
    "BatchGeoSampler",
    "GeoSampler",
    "GridGeoSampler",
    "PreChippedGeoSampler",
    "RandomBatchGeoSampler",
    "RandomGeoSampler",
    "Units",
    "get_random_bounding_box",
    "tile_to_chips",
]


def test_every_torchgeo_sampler_name_is_there():
    assert [n for n in TORCHGEO_SAMPLERS if n not in pipekit.samplers.__all__] == []
    for name in pipekit.samplers.__all__:
        assert hasattr(pipekit.samplers, name), name


def test_they_are_pipekit_geos_own():
    for name in TORCHGEO_SAMPLERS:
        if hasattr(pipekit.geo, name):
            assert getattr(pipekit.samplers, name) is getattr(pipekit.geo, name), name
    assert pipekit.samplers.Units.PIXELS.name == "PIXELS" and pipekit.samplers.Units.CRS.name == "CRS"
