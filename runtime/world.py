"""Placeholder until the world helper's module lands: which MPI rank this process is."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int = 0
    local_size: int = 1

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.size > 1


def detect_world(environ=os.environ) -> World:
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in environ and size in environ:
            return World(int(environ[rank]), int(environ[size]))
    return World(0, 1)
